# Two commands for a newcomer: `make demo` and `make test`. Each sets up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(abspath $(BIN)/python)

.PHONY: demo demo-distributed demo-hosts test faults lint setup system-packages s3a-jars ui ui-distributed clean servers servers-down

$(BIN)/mailq: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# pip's and setuptools' notes (the editable install's warning) go to a log, shown only on a failure.
	$(BIN)/pip install --quiet -e '.[dev]' >$(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	touch $@

setup: $(BIN)/mailq

# The Debian packages the suite, benchmarks and demos need (mailq_servers/system-packages.txt), in one apt-get
# step; as root, or it prints the command to run with sudo. Nothing else, no test, installs a system package.
system-packages:
	@bash mailq_servers/install-system-packages

# The jars of the pipeline's s3a:// outputs (resources/s3a.py), fetched from Maven Central into Spark's Ivy
# cache once, so that no run or test waits on the download.
S3A_JARS := $(VENV)/s3a-jars-fetched

$(S3A_JARS): resources/s3a.py $(BIN)/mailq
	$(BIN)/python -m resources.s3a >$(VENV)/s3a-jars.log 2>&1 || { cat $(VENV)/s3a-jars.log; exit 1; }
	touch $@

s3a-jars: $(S3A_JARS)

# The demo's runs are recorded in a persistent Dagster instance, which `make ui` opens on the demo's data.
DAGSTER_DIR := $(abspath .dagster)
DEMO_DIR := $(abspath .mailq-demo)

$(DAGSTER_DIR)/dagster.yaml: mailq_demo/dagster.yaml
	mkdir -p $(DAGSTER_DIR)
	cp $< $@

demo: export DAGSTER_HOME := $(DAGSTER_DIR)
demo: setup $(DAGSTER_DIR)/dagster.yaml
	$(BIN)/mailq demo --data-dir .mailq-demo

# The same demo on the harness's servers: Cassandra, S3 and RabbitMQ, the pipeline on its Spark cluster.
# Each run replaces the previous one's keyspace, bucket and vhost, named in $(DISTRIBUTED_DIR)/url, and
# keeps its own for `make ui-distributed`; the pipeline's outputs go to the deployment's bucket through s3a,
# where the cluster's workers and the driver reach them without a shared disk.
DISTRIBUTED_DIR := $(abspath .mailq-demo-distributed)
SERVERS_ENV = eval "$$($(BIN)/python -m mailq_servers env)"

demo-distributed: export DAGSTER_HOME := $(DAGSTER_DIR)
demo-distributed: setup s3a-jars $(DAGSTER_DIR)/dagster.yaml
	$(BIN)/python -m mailq_servers up
	$(BIN)/python -m mailq_servers deployment $(DISTRIBUTED_DIR)
	$(SERVERS_ENV) && $(BIN)/mailq --url "$$(cat $(DISTRIBUTED_DIR)/url)" demo $(DEMO_OPTIONS)

# The same demo on the host bed (docs/hosts.md): the servers on hosts of their own (network namespaces,
# as root), `mailq demo` run on the bed's driver host, the pipeline on the bed's Spark cluster (workers on
# the three server hosts). Its outputs go to the deployment's bucket on the objects host, through s3a.
HOSTS_DIR := $(abspath .mailq-demo-hosts)

demo-hosts: export DAGSTER_HOME := $(DAGSTER_DIR)
demo-hosts: setup s3a-jars $(DAGSTER_DIR)/dagster.yaml
	$(BIN)/python -m mailq_servers up hosts
	$(BIN)/python -m mailq_servers deployment --hosts $(HOSTS_DIR)
	$(BIN)/python -m mailq_servers on driver $(abspath $(BIN)/mailq) --url "$$(cat $(HOSTS_DIR)/url)" demo $(DEMO_OPTIONS)

# The suite in two processes, then the tests that need the machine to themselves (tests/conftest.py);
# these run whatever the first part found, and `make test` fails if either part failed. Each part ends with
# its slowest tests, the figures for keeping .ci/run within its time. Work stealing gives each process one half
# of the suite in order, so most modules' fixtures are made once, and an idle process takes tests from the
# other's end.
test: setup system-packages s3a-jars
	$(BIN)/pytest -n 2 --dist worksteal -m 'not alone' --durations=30; first=$$?; $(BIN)/pytest -m 'alone and not faults' --durations=15 && exit $$first

# The network fault scenarios on the host bed (docs/hosts.md, "Partitions"), as root: each prints its
# report, and each still misses a target (the replies' p99, a mail's delay), which is why `make test` leaves
# them out.
faults: setup system-packages
	$(BIN)/pytest -m faults -s --durations=15

# The real servers of the distributed deployment (mailq_servers), installed into ~/.cache/mailq-servers.
servers: setup
	$(BIN)/python -m mailq_servers up

servers-down: setup
	$(BIN)/python -m mailq_servers down

lint: setup
	$(BIN)/ruff check .
	$(BIN)/vulture mailq_runtime mailq_cli mailq_servers assets resources mailq_demo benchmarks vulture_whitelist.py

# `dagster dev` through a launcher that stops it, its webserver, daemon and code server within seconds of
# Ctrl-C or SIGTERM (mailq_demo/ui.py).
ui: export DAGSTER_HOME := $(DAGSTER_DIR)
ui: export MAILQ_URL := embedded://$(DEMO_DIR)
ui: setup $(DAGSTER_DIR)/dagster.yaml
	@test -f $(DEMO_DIR)/mailq.db || { echo "no demo data in $(DEMO_DIR): run 'make demo' first" >&2; exit 1; }
	$(BIN)/python -m mailq_demo.ui -w workspace.yaml -h 127.0.0.1

ui-distributed: export DAGSTER_HOME := $(DAGSTER_DIR)
ui-distributed: setup s3a-jars $(DAGSTER_DIR)/dagster.yaml
	@test -f $(DISTRIBUTED_DIR)/url || { echo "no distributed demo: run 'make demo-distributed' first" >&2; exit 1; }
	$(BIN)/python -m mailq_servers up
	$(SERVERS_ENV) && MAILQ_URL="$$(cat $(DISTRIBUTED_DIR)/url)" $(BIN)/python -m mailq_demo.ui -w workspace.yaml -h 127.0.0.1

# The distributed demo's keyspace, bucket and vhost are removed from the servers when they run (`-`: the
# rest is cleaned either way).
clean:
	-[ ! -f $(DISTRIBUTED_DIR)/url ] || $(BIN)/python -m mailq_servers deployment --remove $(DISTRIBUTED_DIR)
	-[ ! -f $(HOSTS_DIR)/url ] || $(BIN)/python -m mailq_servers deployment --hosts --remove $(HOSTS_DIR)
	rm -rf $(VENV) .mailq .mailq-demo .dagster $(DISTRIBUTED_DIR) $(HOSTS_DIR)
