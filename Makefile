# cdc2ch developer and user entry points. `make demo` and `make test` are the two README commands.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
PIP    := $(BIN)/pip --quiet --disable-pip-version-check
# Each install step says what it does and how long it took (with date: POSIX sh has no SECONDS).
CLOCK  := t=$$(date +%s)
TOOK   := echo "  done in $$(( $$(date +%s) - t )) s"
# The official Delta Sharing connector, the tests' independent client of tests/support/sharing_server.py, in
# its own virtualenv: it pins an older pyarrow than cdc2ch runs.
SHARING_VENV  := .venv-sharing
SHARING_STAMP := $(SHARING_VENV)/.installed

# Prometheus and promtool from Debian's `prometheus` package, unpacked without root for the tests of
# deploy/prometheus (rules, and a real Prometheus scraping cdc2ch). Best effort: where `apt-get download`
# cannot fetch it, the reason goes to $(PROM_DIR)/UNAVAILABLE and those tests skip naming it.
PROM_DIR   := build/prometheus
PROM_STAMP := $(PROM_DIR)/.fetched

.PHONY: install demo test coverage unit lint clean prometheus

install: $(STAMP) $(SHARING_STAMP) prometheus

prometheus: $(PROM_STAMP)

$(PROM_STAMP):
	@mkdir -p $(PROM_DIR)
	@rm -f $(PROM_DIR)/UNAVAILABLE $(PROM_DIR)/prometheus_*.deb
	@if ! command -v apt-get > /dev/null || ! command -v dpkg > /dev/null; then \
	    echo "apt-get/dpkg not found: cannot fetch Debian's prometheus package" > $(PROM_DIR)/UNAVAILABLE; \
	elif ! (cd $(PROM_DIR) && apt-get download prometheus > download.log 2>&1); then \
	    echo "apt-get download prometheus failed: $$(tail -n 1 $(PROM_DIR)/download.log)" > $(PROM_DIR)/UNAVAILABLE; \
	elif ! dpkg -x $(PROM_DIR)/prometheus_*.deb $(PROM_DIR)/root; then \
	    echo "dpkg -x of $$(ls $(PROM_DIR)/prometheus_*.deb) failed" > $(PROM_DIR)/UNAVAILABLE; \
	else \
	    rm -f $(PROM_DIR)/prometheus_*.deb && touch $(PROM_STAMP); \
	fi
	@if [ -f $(PROM_DIR)/UNAVAILABLE ]; then echo "warning: $$(cat $(PROM_DIR)/UNAVAILABLE); the Prometheus tests will skip"; fi

# Everything a developer's machine needs (`make test` and the other gates): a virtualenv, the package with
# test extras, the Delta jars and the S3 connector (fetched once from Maven Central into ~/.cache/cdc2ch/jars)
# and the JVM class archive saved beside them.
$(STAMP): pyproject.toml
	@echo "Installing cdc2ch with its test, lint and type-checking tools into $(VENV) (about 3 minutes, 2 GB; once)..."
	@$(CLOCK); $(PYTHON) -m venv $(VENV) && $(PIP) install --upgrade pip && $(PIP) install -e ".[test]" && $(TOOK)
	@echo "Fetching the Delta jars and the S3 connector into ~/.cache/cdc2ch/jars, and starting Spark once to save its class archive (about 2 minutes, 0.9 GB; once)..."
	@$(CLOCK); $(BIN)/python -m cdc2ch.source.spark.session s3 > /dev/null && $(TOOK)
	@touch $(STAMP)

$(SHARING_STAMP): tests/support/sharing-requirements.txt
	@echo "Installing the Delta Sharing client the tests check against into $(SHARING_VENV) (about 30 s; once)..."
	@$(CLOCK); $(PYTHON) -m venv $(SHARING_VENV) && \
	    $(SHARING_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/support/sharing-requirements.txt && $(TOOK)
	@touch $(SHARING_STAMP)

# What the demo needs and no more: the package without its test extras, and the Delta jars with the class
# archive (no storage connector: the demo's table is on local disk). A developer's full install has all of
# that, so where one is there the demo uses it (updated, like `make install`, when pyproject.toml changed).
$(DEMO_STAMP): pyproject.toml
	@echo "Installing cdc2ch and its dependencies (PySpark, the embedded ClickHouse) into $(VENV) (1-2 minutes, 1.4 GB; once)..."
	@$(CLOCK); $(PYTHON) -m venv $(VENV) && $(PIP) install -e . && $(TOOK)
	@echo "Fetching the Delta jars into ~/.cache/cdc2ch/jars, and starting Spark once to save its class archive (1-2 minutes, 0.3 GB; once)..."
	@$(CLOCK); $(BIN)/python -m cdc2ch.source.spark.session > /dev/null && $(TOOK)
	@touch $(DEMO_STAMP)

demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	@echo "Running the demo: Spark writes a Delta table, cdc2ch replicates it into an embedded ClickHouse (about 1 minute)..."
	@$(BIN)/cdc2ch demo --dir ./cdc2ch-demo

# The quality gates, then the whole suite over PYTEST_WORKERS processes, each with its own Spark session and
# embedded ClickHouse; a file's tests stay on one worker, so the tables a module builds once serve them all.
# The suite is bound by CPU: on two cores three workers finish sooner than four, which only add contention.
PYTEST_WORKERS ?= 3
test: lint docs
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# The unit layer alone: in-memory fakes of the ports, no JVM, no ClickHouse engine (seconds).
unit: install
	$(BIN)/python -m pytest -q -m unit

# The same suite under coverage.py, line and branch, cdc2ch processes the tests start included
# ([tool.coverage] in pyproject.toml): prints the report, and fails under the floor set there.
coverage: install
	rm -rf build/coverage && mkdir -p build/coverage
	$(BIN)/coverage run -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile
	$(BIN)/coverage combine -q
	$(BIN)/coverage report

# Lint, format and types ([tool.ruff] and [tool.mypy] in pyproject.toml): any finding fails.
lint: install
	$(BIN)/ruff check cdc2ch tests bench deploy
	$(BIN)/ruff format --check cdc2ch tests bench deploy
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/) built into site/, its reference generated from the code's
# declarations (docs/hooks/reference.py); --strict: a broken link or anchor fails. `mkdocs serve` for writing.
.PHONY: docs
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The picture of the shipped Grafana dashboard in docs/guides/monitoring.md: each panel's queries answered by a
# real Prometheus scraping a real cdc2ch while commits arrive, drawn by deploy/grafana/picture.py (about 5 min).
# Grafana itself is in none of the package registries the project installs from, so it cannot render it.
.PHONY: dashboard-picture
dashboard-picture: install
	$(BIN)/python deploy/grafana/picture.py docs/img/dashboard.png

clean:
	rm -rf $(VENV) $(SHARING_VENV) cdc2ch-demo .pytest_cache $(PROM_DIR) site

.PHONY: soak
SEED    ?=
MINUTES ?= 60
# A soak under faults (bench/soak.py): MINUTES of chaos over both targets, then an independent check.
# A failure prints its seed: `make soak SEED=...` replays the same schedule and the same writes.
# Then the generated histories (tests/e2e/replication/test_generated_histories.py) with HISTORIES examples
# instead of the suite's few.
HISTORIES ?= 100
soak: install
	$(BIN)/python bench/soak.py --minutes $(MINUTES) $(if $(SEED),--seed $(SEED)) --verbose
	CDC2CH_HISTORY_EXAMPLES=$(HISTORIES) CDC2CH_HISTORY_LENGTH=14 $(BIN)/python -m pytest -q tests/e2e/replication/test_generated_histories.py

.PHONY: bench bench-quick bytecode
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[test,bench]"
	touch $(BENCH_STAMP)

# cdc2ch against the delta-rs reference loop and ClickHouse's own Delta reader (W1-W3), then the snapshot
# readers; writes bench/results.md and bench/results.png; then the cost of reshape, verify, sharing and `status`
# for 300 pipelines (goal < 2 s), what one light turn costs, what a cron poll with nothing new costs (whole
# processes: wall, CPU, peak RSS, beside opening the embedded engine), a fleet of small tables beside a load
# (on local disk, then on an S3 server into a ClickHouse server), and queries on the replica's current view
# against a plain table (20M rows; bench-quick: 2M).
# bench-quick: the workloads at a tenth of the size.
bench: $(BENCH_STAMP) bytecode seaweedfs
	$(BIN)/python bench/workloads.py
	cd bench && ../$(BIN)/python log_changes.py
	$(BIN)/python bench/snapshot_readers.py 2000000
	$(BIN)/python bench/reshape_cost.py 2000000
	$(BIN)/python bench/verify_cost.py 5000000
	$(BIN)/python bench/sharing_rate.py 1000000
	$(BIN)/python bench/status_fleet.py 300
	$(BIN)/python bench/light_turn.py
	$(BIN)/python bench/idle_poll.py
	$(BIN)/python bench/fleet.py
	$(BIN)/python bench/fleet.py --s3
	$(BIN)/python bench/queries.py

bench-quick: $(BENCH_STAMP) bytecode
	$(BIN)/python bench/workloads.py --quick
	cd bench && ../$(BIN)/python log_changes.py --quick
	$(BIN)/python bench/queries.py --quick
	$(BIN)/python bench/light_turn.py
	$(BIN)/python bench/idle_poll.py --runs 3
	$(BIN)/python bench/fleet.py --quick

# SeaweedFS, the S3 store of `bench/fleet.py --s3` (bench/seaweed.py), built from the Go module proxy: its
# module has replace directives, so `go install` refuses it and it is built from its downloaded source. Best
# effort: where Go or the module is missing, the reason goes to $(SEAWEED_DIR)/UNAVAILABLE and the bench
# falls back to moto's server, saying so.
SEAWEED_DIR     := build/seaweedfs
SEAWEED_VERSION := v0.0.0-20261109003541-7506e5f91cd6
.PHONY: seaweedfs
seaweedfs: $(SEAWEED_DIR)/weed

$(SEAWEED_DIR)/weed:
	@mkdir -p $(SEAWEED_DIR) && rm -f $(SEAWEED_DIR)/UNAVAILABLE
	@echo "Building SeaweedFS $(SEAWEED_VERSION) from the Go module proxy into $(SEAWEED_DIR) (about 4 minutes; once)..."
	@$(CLOCK); src=$$(command -v go > /dev/null && cd $(SEAWEED_DIR) && GOFLAGS=-mod=mod go mod download -json \
	        github.com/seaweedfs/seaweedfs@$(SEAWEED_VERSION) 2> download.log | sed -n 's/.*"Dir": "\(.*\)",/\1/p'); \
	if ! command -v go > /dev/null; then \
	    echo "go not found: cannot build SeaweedFS" > $(SEAWEED_DIR)/UNAVAILABLE; \
	elif [ -z "$$src" ]; then \
	    echo "go mod download of SeaweedFS failed: $$(tail -n 1 $(SEAWEED_DIR)/download.log)" > $(SEAWEED_DIR)/UNAVAILABLE; \
	else \
	    rm -rf $(SEAWEED_DIR)/src && cp -r "$$src" $(SEAWEED_DIR)/src && chmod -R u+w $(SEAWEED_DIR)/src && \
	    (cd $(SEAWEED_DIR)/src && GOFLAGS=-mod=mod go build -o ../weed ./weed > ../build.log 2>&1) || \
	    echo "go build of SeaweedFS failed: $$(tail -n 1 $(SEAWEED_DIR)/build.log)" > $(SEAWEED_DIR)/UNAVAILABLE; \
	    rm -rf $(SEAWEED_DIR)/src; \
	fi; $(TOOK)
	@if [ -f $(SEAWEED_DIR)/UNAVAILABLE ]; then echo "warning: $$(cat $(SEAWEED_DIR)/UNAVAILABLE); bench/fleet.py --s3 uses moto"; fi

# cdc2ch's modules compiled before anything is timed, as a wheel's install leaves them: an editable install
# leaves that to each import, which writes nothing under PYTHONDONTWRITEBYTECODE, so every timed process
# would compile them.
bytecode: $(BENCH_STAMP)
	$(BIN)/python -m compileall -q cdc2ch

.PHONY: mutants
# Mutation testing ([tool.mutmut] in pyproject.toml) of the modules that hold the rules (row contract, identity,
# ranking of changes, range planning, offsets) against the unit layer alone; not part of `make test`. Starts from a
# clean mutants/ (mutmut keeps a verdict until the mutated function changes, even when the tests do), then prints
# the score and the survivors (tests/support/mutants_score.py): fails under 90% killed or on a survivor neither killed nor
# listed in tests/mutants-equivalent.txt. About 9 minutes on 2 cores.
mutants: install
	rm -rf mutants
	$(BIN)/mutmut run --max-children 2
	$(BIN)/python tests/support/mutants_score.py
