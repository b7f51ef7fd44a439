# Two commands on a fresh machine: `make run` serves the API, `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000

.PHONY: run test test-fast coverage bench bench-quick install-prod clean

run: $(VENV)/.installed
	PORT=$(PORT) $(BIN)/gunicorn wsgi:app

test: $(VENV)/.installed
	$(BIN)/pytest

# The development loop: everything that needs no process of its own (PostgreSQL, Redis, gunicorn,
# a browser, a flask command), in about a minute. `make test` still runs the whole suite.
test-fast: $(VENV)/.installed
	$(BIN)/pytest -m "not servers"

# Line coverage of the product by `make test`, the processes it starts included (.coveragerc).
coverage: $(VENV)/.installed
	rm -f .coverage .coverage.*
	COVERAGE_DATA_DIR=$(CURDIR) $(BIN)/coverage run -m pytest
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report

bench: $(VENV)/.installed
	bash bench/setup.sh
	$(BIN)/python bench/run_all.py

# Every bench in its short mode (a few minutes): that each still runs end to end, not its figures.
bench-quick: $(VENV)/.installed
	bash bench/setup.sh
	BENCH_QUICK=1 $(BIN)/python bench/run_all.py

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Python 3.11 or newer is required (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

# A production virtualenv (docs/deploying.md): the runtime dependencies only (requirements.txt), on the
# system's python3, which the service's user can run (a python under root's home, such as pyenv's, is not).
PROD_PYTHON ?= /usr/bin/python3
install-prod:
	@$(PROD_PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Python 3.11 or newer is required (set PROD_PYTHON=...)"; exit 1; }
	$(PROD_PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.txt

clean:
	rm -rf $(VENV) instance .pytest_cache .coverage .coverage.*
