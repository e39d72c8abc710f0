# Set-up and entry points. `make demo` runs the main job on the local filesystem (no
# server needed); `make test` runs the whole test suite against real emulators.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
DEMO_DIR ?= $(CURDIR)/demo-data

.PHONY: venv install install-dev demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

venv: $(BIN)/python

install: venv
	$(BIN)/python -m pip install -q -e .

install-dev: venv
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	npm install --no-audit --no-fund --loglevel=error

demo: install
	$(BIN)/shardstore store check file://$(DEMO_DIR)/store
	$(BIN)/python -m benches blobstore --backends memory,file

# Byte-compiling first keeps compile() off background threads during the run (see the
# note on --tb=native in pyproject.toml).
test: install-dev
	$(BIN)/python -m compileall -q shardstore blobstores plugins engine translog segments benches
	$(BIN)/python -m pytest -q

bench: install-dev
	$(BIN)/python -m benches

clean:
	rm -rf $(DEMO_DIR) build dist *.egg-info .pytest_cache
