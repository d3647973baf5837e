# Two commands for a newcomer: `make demo` and `make test`. Each sets up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(abspath $(BIN)/python)

.PHONY: demo test lint setup ui clean servers servers-down

$(BIN)/mailq: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

setup: $(BIN)/mailq

# The demo's runs are recorded in a persistent Dagster instance, which `make ui` opens on the demo's data.
DAGSTER_DIR := $(abspath .dagster)
DEMO_DIR := $(abspath .mailq-demo)

$(DAGSTER_DIR)/dagster.yaml:
	mkdir -p $(DAGSTER_DIR)
	touch $@

demo: export DAGSTER_HOME := $(DAGSTER_DIR)
demo: setup $(DAGSTER_DIR)/dagster.yaml
	$(BIN)/mailq demo

test: setup
	$(BIN)/pytest

# The real servers of the distributed tests (tests/servers), installed into ~/.cache/mailq-servers.
servers: setup
	$(BIN)/python -m tests.servers up

servers-down: setup
	$(BIN)/python -m tests.servers down

lint: setup
	$(BIN)/ruff check .

ui: export DAGSTER_HOME := $(DAGSTER_DIR)
ui: export MAILQ_URL := embedded://$(DEMO_DIR)
ui: setup $(DAGSTER_DIR)/dagster.yaml
	@test -f $(DEMO_DIR)/mailq.db || { echo "no demo data in $(DEMO_DIR): run 'make demo' first" >&2; exit 1; }
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1

clean:
	rm -rf $(VENV) .mailq .mailq-demo .dagster
