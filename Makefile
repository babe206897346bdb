# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first if needed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: all setup bytecode demo test test-fast clean

all: setup

setup: $(STAMP)

# .venv is made by uv (pinned here, installed by pip), which downloads and unpacks the packages and compiles their bytecode
# on every core at once: 1 min 37 s and 1 min 58 s for requirements.txt on a 2-core machine where pip alone took about 6 min (the same 221
# packages at the same versions; docs/testing.md). Where uv cannot be installed, or cannot reach an index that only pip's
# configuration names, pip installs requirements.txt as before.
UV := uv==0.13.9

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	($(PY) -m pip install --quiet --disable-pip-version-check $(UV) \
	  && $(PY) -m uv pip install --quiet --python $(PY) --compile-bytecode -r requirements.txt) \
	  || $(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m flows demo

# Three test processes (pytest-xdist) on a 2-core machine, each module whole on one of them: its shared fixtures (a dataset,
# a trained model, the demo run) are built once. The slowest modules start first (tests/conftest.py). A third process
# keeps both cores busy while another waits on a server or a child (docs/testing.md has the timings).
TEST_JOBS ?= 3

# The project's modules are compiled once before a test run (as pip compiles an installed package's): its several hundred
# Python processes then read their bytecode instead of compiling the modules they import, each on its own, where the
# environment says not to write bytecode (PYTHONDONTWRITEBYTECODE).
bytecode: $(STAMP)
	$(PY) -m compileall -q flows tasks models infra tests > /dev/null

test: bytecode
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --max-worker-restart 1

# The fast tier: unit and small integration tests, no servers of their own (a few minutes on 2 cores).
test-fast: bytecode
	$(PY) -m pytest -m "not full" -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --max-worker-restart 1

clean:
	rm -rf data mlartifacts mlflow.db
