"""The Cassandra metadata store's session: one cassandra-driver `Cluster` and `Session` on the mailq keyspace,
shared by the DAOs of every record (queue_view, configuration, blobs, mailboxes, dead_letters,
delayed_mails).

Every statement is prepared once per store and run at the store's consistency level (LOCAL_QUORUM by
default); lightweight transactions run their Paxos round at LOCAL_SERIAL (SERIAL when the level is not a
LOCAL_ one). Built from its options (options.py): the URL and the environment are the settings' business. The
password goes to the driver's auth provider and nowhere else: no error or log of this module shows it.

Every statement runs through this module (`execute`, `execute_async`, `execute_all`, `batch`,
`write_all`, `applied`), and every failure of the driver reaches the DAOs' callers as a mailq error
chained to the driver's, the next pages of a paged result included: StoreUnavailable for an outage (no
host, too few replicas, a timeout, a lost connection), StoreUnusable for a statement the server refuses
as written (a table or column missing or altered under a running process, a permission revoked), which
waiting does not cure.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from cassandra import (
    AuthenticationFailed,
    DriverException,
    OperationTimedOut,
    ReadTimeout,
    RequestValidationException,
    UnresolvableContactPoints,
    WriteTimeout,
    protocol,
)
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
    Session,
)
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.connection import ConnectionException
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.pool import NoConnectionsAvailable
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from ...errors import MailqError, NoStore, StoreUnavailable, StoreUnusable
from ...tls import tls_failure
from .options import CassandraOptions
from .schema import TABLES, create_schema, missing_columns
from .tallies import Tallies

# The table a statement names, after FROM, INTO or UPDATE.
_TABLE = re.compile(r"\b(FROM|INTO|UPDATE)\s+(?=[a-z_]+\b)")
# Seconds between looks at a node that went down: doubling from the first up to the last.
_RECONNECT_FIRST, _RECONNECT_MAX = 0.5, 5.0
# A node cut off by a partition answers nothing, and its requests would wait the whole request timeout:
# an idempotent statement unanswered after this many seconds is sent to the next node as well, the first
# answer winning (one more at most). A quorum of the others answers in milliseconds.
_SPECULATE_AFTER, _SPECULATIONS = 0.5, 1
# A connection that stays silent is found dead by its heartbeat (a request on an idle connection every
# interval, unanswered after the timeout), the node then leaving the query plans until it answers again,
# instead of after the driver's 30 + 30 s.
_HEARTBEAT_INTERVAL, _HEARTBEAT_TIMEOUT = 5, 5
# How many statements of one call are in flight at once (a slice's buckets, a mail's blobs ...).
_CONCURRENCY = 32
# What the driver raises when a statement fails: its own errors (NoHostAvailable is not one of them), a
# server's error it passes on as received (ServerError, Overloaded, SyntaxException ...), a connection's.
_FAILURES = (
    DriverException,
    NoHostAvailable,
    protocol.ErrorMessage,
    ConnectionException,
    NoConnectionsAvailable,
    OSError,
)
# The statement as written is refused: a programming error or a schema changed under the process.
_REFUSALS = (RequestValidationException, protocol.RequestValidationException)
# The verb of a statement and the table it names, for an error's message.
_STATEMENT = re.compile(r"^\s*(\w+)\b.*?\b(?:FROM|INTO|UPDATE)\s+(\w+(?:\.\w+)?)", re.IGNORECASE | re.DOTALL)


class CassandraStore:
    def __init__(self, options: CassandraOptions, *, create: bool = False) -> None:
        """Connect to the options' keyspace. With `create`, the keyspace (with the options' replication)
        and every table are created first where missing; without it, a keyspace or table that is missing
        raises NoStore."""
        self.keyspace = options.keyspace
        self.where = f"{', '.join(options.contact_points)} port {options.port}"
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(
                DCAwareRoundRobinPolicy(local_dc=options.local_datacenter)
            ),
            consistency_level=options.consistency_level,
            serial_consistency_level=options.serial_consistency_level,
            request_timeout=options.request_timeout,
            speculative_execution_policy=ConstantSpeculativeExecutionPolicy(_SPECULATE_AFTER, _SPECULATIONS),
        )
        connect_timeout = max(5.0, options.request_timeout / 3)
        try:
            self.cluster = Cluster(
                list(options.contact_points),
                port=options.port,
                auth_provider=None
                if options.username is None
                else PlainTextAuthProvider(options.username, options.password),
                execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                ssl_context=options.ssl_context,
                connect_timeout=connect_timeout,
                # Connecting reads the schema of every keyspace, which a busy node may take more than the
                # driver's default 2 s to return: it is slow, not away.
                control_connection_timeout=connect_timeout,
                # The driver's default waits up to 10 minutes between looks at a node that went down: an
                # outage would then delay mails by that, not by its own length.
                reconnection_policy=ExponentialReconnectionPolicy(_RECONNECT_FIRST, _RECONNECT_MAX),
                idle_heartbeat_interval=_HEARTBEAT_INTERVAL,
                idle_heartbeat_timeout=_HEARTBEAT_TIMEOUT,
            )
        except UnresolvableContactPoints:
            raise StoreUnavailable(
                f"cannot connect to Cassandra at {self.where}: no host name resolves (check the hosts)"
            ) from None
        try:
            self.session = self._connect(create, dict(options.replication), options.password)
        except BaseException:
            self.cluster.shutdown()
            raise
        self._prepared: dict[str, PreparedStatement] = {}
        self._preparing = threading.Lock()
        # This process's shares of the counts, under a writer id of its own (tallies.py).
        self.tallies = Tallies(self, secrets.token_hex(8))

    def _connect(self, create: bool, replication: dict, password: str | None) -> Session:
        try:
            session = self.cluster.connect()
        except _FAILURES as error:
            reason = tls_failure(error) or _reason(error)
            if password:
                reason = reason.replace(password, "***")
            raise StoreUnavailable(f"cannot connect to Cassandra at {self.where}: {reason}") from None
        self.created = create and self.keyspace not in self.cluster.metadata.keyspaces
        if create:
            try:
                create_schema(session, self.keyspace, replication)
            except _FAILURES as error:
                raise self.failure(error, f"creating the schema of keyspace {self.keyspace!r}") from error
        else:
            metadata = self.cluster.metadata.keyspaces.get(self.keyspace)
            if metadata is None:
                raise NoStore(
                    f"no keyspace {self.keyspace!r} in Cassandra at {self.where}: "
                    "nothing was created there yet (create the schema first)"
                )
            missing = sorted(set(TABLES) - set(metadata.tables))
            if missing:
                raise NoStore(
                    f"keyspace {self.keyspace!r} at {self.where} lacks the tables {', '.join(missing)} "
                    "(create the schema first)"
                )
            columns = [f"{table}.{column}" for table, column in missing_columns(metadata)]
            if columns:
                raise NoStore(
                    f"keyspace {self.keyspace!r} at {self.where} lacks the columns {', '.join(columns)} "
                    "of this version of mailq (create the schema first: it adds them)"
                )
        return session

    def statement(self, cql: str) -> PreparedStatement:
        """The statement prepared, its table qualified with the keyspace: the DAOs name tables alone, and
        the server advises against resolving prepared statements against a session's keyspace."""
        prepared = self._prepared.get(cql)
        if prepared is None:
            with self._preparing:
                prepared = self._prepared.get(cql)
                if prepared is None:
                    qualified = _TABLE.sub(rf"\1 {self.keyspace}.", cql, count=1)
                    prepared = self.session.prepare(qualified)
                    # The driver sends only an idempotent statement speculatively.
                    prepared.is_idempotent = _idempotent(cql)
                    self._prepared[cql] = prepared
        return prepared

    def execute(self, cql: str, parameters: Sequence = ()):
        """The statement's result set (rows, `.one()`). Run again after a failure `_worth_a_retry`."""
        try:
            rows = self._retried(self.statement(cql), parameters, idempotent=_idempotent(cql))
        except _FAILURES as error:
            raise self.failure(error, _doing(cql)) from error
        return _Pages(self, cql, rows) if rows.has_more_pages else rows

    def _retried(self, statement, parameters: Sequence | None = None, *, idempotent: bool):
        """The statement run, and run again after a failure `_worth_a_retry`."""
        tries_left, timeouts_left = _RETRIES, _TIMEOUT_RETRIES
        while True:
            try:
                return self.session.execute(statement, parameters)
            except _TIMEOUTS:
                if not idempotent or not timeouts_left:
                    raise
                timeouts_left -= 1
                continue
            except _FAILURES as error:
                if not tries_left or not _worth_a_retry(error):
                    raise
            tries_left -= 1
            time.sleep(_RETRY_PAUSE)

    def execute_async(self, cql: str, parameters: Sequence = ()) -> Pending:
        """The statement started; its `.result()` waits for the result set."""
        try:
            future = self.session.execute_async(self.statement(cql), parameters)
        except _FAILURES as error:
            raise self.failure(error, _doing(cql)) from error
        return Pending(self, cql, future)

    def execute_all(self, cql: str, parameter_sets: Iterable[Sequence]) -> list:
        """Run one statement once per parameter set, concurrently; the result sets in order. Raises the
        first failure."""
        parameter_sets = list(parameter_sets)
        if not parameter_sets:
            return []
        if len(parameter_sets) == 1:
            return [self.execute(cql, parameter_sets[0])]
        try:
            results = execute_concurrent_with_args(
                self.session,
                self.statement(cql),
                parameter_sets,
                concurrency=_CONCURRENCY,
                raise_on_first_error=True,
                results_generator=False,
            )
        except _FAILURES as error:
            raise self.failure(error, _doing(cql)) from error
        return [_Pages(self, cql, rows) if rows.has_more_pages else rows for _, rows in results]

    def batch(self, cql: str, parameter_sets: Sequence[Sequence]) -> None:
        """Run one statement once per parameter set in one unlogged batch, one request: rows of one
        partition are applied as a single mutation, whole; a few rows of several partitions each on its
        own, no more atomic than separate writes. At least one parameter set."""
        statement = self.statement(cql)
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.is_idempotent = statement.is_idempotent
        for parameters in parameter_sets:
            batch.add(statement, parameters)
        try:
            self.session.execute(batch)
        except _FAILURES as error:
            raise self.failure(error, _doing(cql)) from error

    def write_all(self, statements: Sequence[tuple[str, Sequence]]) -> None:
        """Run idempotent writes (CQL and parameters) in one unlogged batch, one request, each partition's
        applied on its own; retried after a timeout as a lone idempotent write is. At least one."""
        if len(statements) == 1:
            self.execute(*statements[0])
            return
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.is_idempotent = True
        for cql, parameters in statements:
            batch.add(self.statement(cql), parameters)
        try:
            self._retried(batch, idempotent=True)
        except _FAILURES as error:
            raise self.failure(error, _doing(statements[0][0])) from error

    def applied(self, cql: str, parameters: Sequence = ()):
        """Run a lightweight transaction; its row (`.applied`, and the current values when not applied)."""
        return self.execute(cql, parameters).one()

    def close(self) -> None:
        self.cluster.shutdown()

    def failure(self, error: BaseException, doing: str) -> MailqError:
        """The mailq error for the driver's `error` while `doing` something: one line, the hosts and the
        reason in it, never the password."""
        reason = _reason(error)
        provider = self.cluster.auth_provider
        password = getattr(provider, "password", None)
        if password:
            reason = reason.replace(password, "***")
        if isinstance(error, _REFUSALS):
            return StoreUnusable(
                f"Cassandra at {self.where} refused {doing} in keyspace {self.keyspace!r}: {reason} "
                "(a schema made by another version of mailq, or changed since this process started?)"
            )
        return StoreUnavailable(f"Cassandra at {self.where} failed {doing}: {reason}")


class Pending:
    """A statement started by `execute_async`: `.result()` waits for its result set, a failure raised as
    the store's. `future` is the driver's, for what it tells of the request (its message, its host)."""

    __slots__ = ("_store", "_cql", "future")

    def __init__(self, store: CassandraStore, cql: str, future: ResponseFuture) -> None:
        self._store, self._cql, self.future = store, cql, future

    def result(self):
        try:
            rows = self.future.result()
        except _FAILURES as error:
            raise self._store.failure(error, _doing(self._cql)) from error
        return _Pages(self._store, self._cql, rows) if rows.has_more_pages else rows


class _Pages:
    """A result set of more than one page, whose next pages the driver fetches while it is iterated: a
    failure then (a lost connection, a timeout) is raised as the store's too. A result of one page, the
    usual one, is returned as it is: it can no longer fail."""

    __slots__ = ("_store", "_cql", "_rows")

    def __init__(self, store: CassandraStore, cql: str, rows) -> None:
        self._store, self._cql, self._rows = store, cql, rows

    def __iter__(self) -> Iterator:
        rows = iter(self._rows)
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except _FAILURES as error:
                raise self._store.failure(error, f"{_doing(self._cql)} (reading its next page)") from error
            yield row

    def one(self):
        return self._rows.one()

    def all(self) -> list:
        return list(self)


# Cassandra's CAS_WRITE_UNKNOWN: a Paxos round's proposal was accepted by some replicas, not a quorum.
_CAS_WRITE_UNKNOWN = 0x1700
# How many more times, and how long apart, a statement `_worth_a_retry` is sent. Nothing was written by
# such a failure, so the retries only make the caller wait, at most 5 s.
_RETRIES, _RETRY_PAUSE = 10, 0.5
# A timeout leaves unknown whether the statement was applied (its reply lost, or late): an idempotent one
# is sent again this many more times, each with the request timeout, and a lost reply costs the caller a
# wait, not a failure. The counts are idempotent writes too (tallies.py).
_TIMEOUTS = (OperationTimedOut, WriteTimeout, ReadTimeout)
_TIMEOUT_RETRIES = 2
# A lightweight transaction: sent again, it may find its own first write (see `_worth_a_retry`).
_CONDITIONAL = re.compile(r"\bIF\s+(NOT\s+EXISTS|EXISTS|\w+\s*=)", re.IGNORECASE)


def _idempotent(cql: str) -> bool:
    """Whether the statement may be run twice with the result of once: every statement but a lightweight
    transaction (mailq writes no counter: tallies.py)."""
    return _CONDITIONAL.search(cql) is None


def _worth_a_retry(error: BaseException) -> bool:
    """A lightweight transaction whose result is unknown because the coordinator lost replicas in the
    middle of its Paxos round (the driver does not retry it). The next round first completes or
    supersedes the proposal left behind, then answers: a row not applied may then be this call's own
    first write, which each caller reads as written by another (the existing row's values, or "marked
    already"): the same as the failed call's retry by its caller would see."""
    return isinstance(error, protocol.ErrorMessage) and error.code == _CAS_WRITE_UNKNOWN


def _doing(cql: str) -> str:
    """What a statement does, as an error says it: "SELECT on queues"."""
    match = _STATEMENT.match(cql)
    if match is None:
        return f"the statement {' '.join(cql.split())[:60]!r}"
    return f"{match.group(1).upper()} on {match.group(2).rpartition('.')[2]}"


def _reason(error: BaseException) -> str:
    """The driver's error in one line; for "no host available", each host's own reason."""
    errors = getattr(error, "errors", None)
    if isinstance(errors, dict) and errors:
        reasons = []
        for host, cause in errors.items():
            if isinstance(cause, AuthenticationFailed):
                reasons.append(f"{host}: authentication failed (check the username and password)")
            else:
                reasons.append(f"{host}: {type(cause).__name__}: {cause}")
        return " ".join("; ".join(reasons).split())
    return " ".join(f"{type(error).__name__}: {error}".split())
