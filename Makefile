# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first if needed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: all setup demo test test-fast clean

all: setup

setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m flows demo

test: $(STAMP)
	$(PY) -m pytest

# The fast tier: unit and small integration tests, no servers (a few minutes on 2 cores).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not full"

clean:
	rm -rf data mlartifacts mlflow.db
