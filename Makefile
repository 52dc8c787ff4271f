# cdc2ch developer and user entry points. `make demo` and `make test` are the two README commands.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The official Delta Sharing connector, the tests' independent client of tests/sharing_server.py, in its own
# virtualenv: it pins an older pyarrow than cdc2ch runs.
SHARING_VENV  := .venv-sharing
SHARING_STAMP := $(SHARING_VENV)/.installed

.PHONY: install demo test unit lint clean

install: $(STAMP) $(SHARING_STAMP)

# Everything a fresh machine needs: a virtualenv, the package with test extras, the Delta jars
# (fetched once from Maven Central into ~/.cache/cdc2ch/jars) and the JVM class archive saved beside them.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/python -m cdc2ch.source.spark > /dev/null
	touch $(STAMP)

$(SHARING_STAMP): tests/sharing-requirements.txt
	$(PYTHON) -m venv $(SHARING_VENV)
	$(SHARING_VENV)/bin/pip install --quiet -r tests/sharing-requirements.txt
	touch $(SHARING_STAMP)

demo: install
	$(BIN)/cdc2ch demo --dir ./cdc2ch-demo

test: install
	$(BIN)/python -m pytest -q

# The unit layer alone: in-memory fakes of the ports, no JVM, no ClickHouse engine (seconds).
unit: install
	$(BIN)/python -m pytest -q -m unit

lint: install
	$(BIN)/ruff check cdc2ch tests
	$(BIN)/ruff format --check cdc2ch tests

clean:
	rm -rf $(VENV) $(SHARING_VENV) cdc2ch-demo .pytest_cache

.PHONY: bench bench-quick
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[test,bench]"
	touch $(BENCH_STAMP)

# cdc2ch against the delta-rs reference loop and ClickHouse's own Delta reader (W1-W3), then the snapshot
# readers; writes bench/results.md and bench/results.png; then the cost of reshape, verify, sharing and `status`
# for 300 pipelines (goal < 2 s), what one light turn costs, and a fleet of small tables beside a load.
# bench-quick: the workloads at a tenth of the size.
bench: $(BENCH_STAMP)
	$(BIN)/python bench/workloads.py
	$(BIN)/python bench/snapshot_readers.py 2000000
	$(BIN)/python bench/reshape_cost.py 2000000
	$(BIN)/python bench/verify_cost.py 5000000
	$(BIN)/python bench/sharing_rate.py 1000000
	$(BIN)/python bench/status_fleet.py 300
	$(BIN)/python bench/light_turn.py
	$(BIN)/python bench/fleet.py

bench-quick: $(BENCH_STAMP)
	$(BIN)/python bench/workloads.py --quick
	$(BIN)/python bench/light_turn.py
	$(BIN)/python bench/fleet.py --quick
