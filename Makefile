# Two commands for a newcomer: `make demo` and `make test`. Each sets up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(abspath $(BIN)/python)

.PHONY: demo test lint setup ui clean

$(BIN)/mailq: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

setup: $(BIN)/mailq

demo: setup
	$(BIN)/mailq demo

test: setup
	$(BIN)/pytest

lint: setup
	$(BIN)/ruff check .

ui: setup
	DAGSTER_HOME=$(abspath .dagster) $(BIN)/dagster dev -w workspace.yaml

clean:
	rm -rf $(VENV) .mailq .mailq-demo .dagster
