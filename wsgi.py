"""The WSGI entry point for gunicorn and `flask`. Builds the app and starts nothing else."""

from app import create_app

app = create_app()
