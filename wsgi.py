"""The WSGI entry point for gunicorn and `flask`. Builds the app and starts nothing else."""

import sys

from app import create_app
from partner.errors import APP_LOAD_ERROR, StartRefused

try:
    app = create_app()
except StartRefused:  # said in one line already; a traceback would bury it
    sys.exit(APP_LOAD_ERROR)
