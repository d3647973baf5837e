"""Vulture's false positives: names that are used where vulture cannot see it (by a framework, by a
protocol, by callers outside the scanned packages). `make lint` passes this file to vulture beside the
packages; it is never imported or run. Vulture matches names alone, so `_.name` stands for an attribute or
method of any object."""

# Dagster asset checks: Dagster calls them, found through their @asset_check decorator.
every_reference_finds_its_blob
counters_match_source_of_truth
slice_counters_match_recount
browse_start_not_ahead_of_live_mail
no_live_blob_deleted_by_the_plan
no_live_blob_collected

# Dagster's IOManager and ConfigurableResource hooks: Dagster calls them.
_.handle_output
_.load_input
_.setup_for_execution
_.teardown_after_execution

# Spark's Python data source API: Spark calls DataSource.reader.
_.reader

# Driver settings made by assignment: sqlite3's Connection.text_factory, a cassandra-driver Statement's
# fetch_size.
_.text_factory
_.fetch_size

# An atexit hook, registered by its decorator.
_close_stores

# Public API whose callers are outside the scanned packages: queue.publisher.publish_due
# (docs/operating.md: one round of the delayed-mail publisher), the fault injector's `armed` (the
# crash-order tests).
_.publish_due
_.armed

# WorkerStats' counters, reported whole by `mailq worker` (dataclasses.asdict).
lease_expired
already_delivered

# The exception triple of __exit__, whose signature Python fixes.
trace

# Public API used by tests and callers outside the scanned packages: DeduplicatingBlobStore.save
# (Runtime.blobs.save), the harness's Cassandra node `durable` flag, cluster controls and Spark facts the
# tests read (mailq_servers is the tests' and benchmarks' harness).
_.save
_.durable
_.stop_node
_.start_node
_.kill_node
_.kill_all
_.start_all
_.leaders
_.private
_.node_up
_.index_of
_.delete_all
Vhosts
_.web_ui_url
_.cores
# The host bed's faults and its check of the hosts' views of the files, which the bed's tests use.
_.pause
processes_reading_elsewhere
# The Prometheus server's controls the metrics tests use.
_.scraping
_.await_value

# aiosmtpd's hooks and settings: its SMTP class calls the handler's handle_* methods and its
# authenticator with (server, session, envelope, mechanism, data), and reads the limits set on the session.
_.handle_EHLO
_.handle_MAIL
_.handle_RCPT
_.handle_DATA
_.handle_exception
_.factory  # its Controller makes each session's SMTP instance by calling factory()
mechanism
_.local_part_limit
_.command_size_limits
_.smtp_DATA  # its session calls smtp_<COMMAND> by name, and _getaddr for MAIL's and RCPT's address
_._getaddr

# dnspython's resolver settings: the resolver reads the attributes set on it.
_.nameservers
_.lifetime

# smtplib reads the encoding of the commands it sends from its client.
_.command_encoding

# Used by the tests only: the installer beside the list, and one node of the RabbitMQ cluster alone.
INSTALLER
_.node_server
