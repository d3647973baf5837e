"""Runtime settings from one URL, parsed here and nowhere else (`Settings.from_url`).

    embedded://<data dir>?<options>                                      (default: embedded://.mailq)
    cassandra://[user@]host[:port][,host[:port]...]/<keyspace>?s3=<bucket>&broker=<broker>&<options>

The embedded deployment keeps the metadata, the broker and the content in one SQLite file under its data
dir. The distributed one keeps the metadata in Cassandra (port 9042 unless given; `consistency`, default
LOCAL_QUORUM; `replication`, default 1, used when `mailq schema create` makes the keyspace), the content in
an S3 bucket (`s3_endpoint`, `s3_region`, `s3_prefix` optional) and its broker is `embedded:<dir>` or
`amqp[s]://[user@]host[:port][,host[:port]...]/<vhost>[?queues=classic|quorum]`: the nodes of one RabbitMQ
cluster (the broker connects to any that answers), and its queues' type, classic (the default) or quorum
(replicated; see brokers/rabbitmq/). Both take the queue options of `_QUEUE_OPTIONS`.

TLS (tls.py): `amqps://` and an `https://` s3_endpoint encrypt those links; `tls=on` encrypts Cassandra's
too and refuses any link in the clear. `ca`, `cert` and `key` name the PEM files (absolute paths) of the
CA that verifies every server (the system's CAs without it) and of a client certificate. Without TLS, every
byte crosses the network in the clear: for loopback set-ups only.

A mailq URL never carries a password: Cassandra's and RabbitMQ's come from MAILQ_CASSANDRA_PASSWORD and
MAILQ_AMQP_PASSWORD, S3's credentials from the standard AWS chain, each read by the process that connects
(a Spark executor included), so no Settings, no Spark plan and no message holds one. A URL whose userinfo
holds one, the broker's included, is refused, and every message that shows a URL shows it through `redact`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, unquote_plus, urlencode

from .clock import MICROS_PER_SECOND
from .config import QueueViewConfiguration
from .errors import InvalidInput, shown
from .model import parse_count, parse_duration
from .tls import TlsFiles, tls_files
from .url_parts import (
    BUCKET,
    KEYSPACE,
    PREFIX,
    REGION,
    USER,
    VHOST,
    choice,
    host_port,
    matching,
    split_authority,
    userinfo_of,
)

DEFAULT_URL = "embedded://.mailq"
URL_VARIABLE = "MAILQ_URL"
CASSANDRA_PASSWORD_VARIABLE = "MAILQ_CASSANDRA_PASSWORD"
AMQP_PASSWORD_VARIABLE = "MAILQ_AMQP_PASSWORD"
EMBEDDED = "embedded"
CASSANDRA = "cassandra"
CASSANDRA_PORT = 9042
AMQP_PORT = 5672
AMQPS_PORT = 5671
DEFAULT_CONSISTENCY = "LOCAL_QUORUM"
# The levels that serve reads and writes alike (ANY only writes; SERIAL and LOCAL_SERIAL only order
# lightweight transactions).
CONSISTENCY_LEVELS = (
    "ONE",
    "TWO",
    "THREE",
    "QUORUM",
    "ALL",
    "LOCAL_QUORUM",
    "EACH_QUORUM",
    "LOCAL_ONE",
)
DURABILITIES = ("fsync", "power", "process")  # see stores/embedded/store.py

_CONFIGURATION_OPTIONS = ("slice_window", "bucket_count", "update_browse_start_pace")
_QUEUE_OPTIONS = (
    "visibility_timeout",
    "clock_skew_grace",
    "max_message_size",
    "durability",
    *_CONFIGURATION_OPTIONS,
)
_TLS_OPTIONS = ("tls", "ca", "cert", "key")
_DISTRIBUTED_OPTIONS = (
    "s3",
    "s3_endpoint",
    "s3_region",
    "s3_prefix",
    "broker",
    "consistency",
    "replication",
    *_TLS_OPTIONS,
)
OPTIONS = {EMBEDDED: _QUEUE_OPTIONS, CASSANDRA: (*_DISTRIBUTED_OPTIONS, *_QUEUE_OPTIONS)}
# The options of the broker's own amqp:// URL.
BROKER_OPTIONS = ("queues",)
BROKER_QUEUE_TYPES = ("classic", "quorum")
# Options whose value is itself a URL: `redact` shows them redacted in turn.
_URL_OPTIONS = ("broker", "s3_endpoint")
_KNOWN_OPTIONS = frozenset([*(name for names in OPTIONS.values() for name in names), *BROKER_OPTIONS])


def _option_shown(option: str) -> str:
    name, equals, value = option.partition("=")
    known = unquote_plus(name)
    if known not in _KNOWN_OPTIONS:
        return name + "=***"
    if known in _URL_OPTIONS and equals:
        # Decoded first: an encoded password (%3A, %40) must not slip past.
        return name + "=" + redact(unquote_plus(value))
    return option


def redact(url: str) -> str:
    """`url` as a message may show it: a password in its userinfo or in the URL of an option (the
    broker's), and the value of any option mailq does not know (it may be a key), replaced by ***."""
    head, authority, tail = split_authority(url)
    userinfo = userinfo_of(authority)
    if userinfo is not None and ":" in userinfo:
        authority = userinfo.partition(":")[0] + ":***@" + authority.rpartition("@")[2]
    path, question, rest = tail.partition("?")
    if question:
        query, hash_mark, fragment = rest.partition("#")
        tail = path + "?" + "&".join(map(_option_shown, query.split("&"))) + hash_mark + fragment
    return head + authority + tail


@dataclass(frozen=True)
class CassandraSettings:
    """Where the metadata tables are: a Cassandra cluster's keyspace."""

    contact_points: tuple[tuple[str, int], ...]
    keyspace: str
    user: str | None = None
    consistency: str = DEFAULT_CONSISTENCY
    replication: int = 1
    tls: bool = False

    def password(self) -> str | None:
        """Read from the environment of the process that connects, never from the URL."""
        return os.environ.get(CASSANDRA_PASSWORD_VARIABLE)


@dataclass(frozen=True)
class S3Settings:
    """Where the blob content is: a bucket of any S3 API (AWS's when no endpoint is given); credentials
    from the standard AWS chain."""

    bucket: str
    endpoint: str | None = None
    region: str | None = None
    prefix: str = ""


@dataclass(frozen=True)
class AmqpSettings:
    """The broker when it is RabbitMQ: a node (`host`, `port`) and the cluster's other nodes, if any."""

    host: str
    port: int = AMQP_PORT
    vhost: str = "/"
    user: str | None = None
    more_hosts: tuple[tuple[str, int], ...] = ()
    queues: str = "classic"
    tls: bool = False  # amqps://

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        return ((self.host, self.port), *self.more_hosts)

    def password(self) -> str | None:
        """Read from the environment of the process that connects, never from the URL."""
        return os.environ.get(AMQP_PASSWORD_VARIABLE)


@dataclass(frozen=True)
class Settings:
    """The deployment's parts and the runtime's options. `backend` names the deployment; `data_dir` is
    the directory of its embedded parts: the whole store of `embedded`, the broker's of `cassandra` with
    `broker=embedded:<dir>`. No field ever holds a secret, so Settings can be shown and shipped."""

    backend: str
    data_dir: Path | None = None
    visibility_timeout: int = 300 * MICROS_PER_SECOND
    clock_skew_grace: int = 60 * MICROS_PER_SECOND
    max_message_size: int = 32 * 1024 * 1024
    durability: str = "fsync"
    # View configuration values a creating open registers, as James does at start-up; the others keep
    # their stored values.
    view_configuration: dict[str, int] | None = None
    cassandra: CassandraSettings | None = None
    s3: S3Settings | None = None
    amqp: AmqpSettings | None = None  # None: the embedded broker in data_dir
    tls_files: TlsFiles = TlsFiles()  # of every link that speaks TLS
    url: str = field(default="", compare=False)  # as given, for messages: always through `redact`

    @classmethod
    def from_url(cls, url: str | None = None) -> Settings:
        """The settings of `url`, else of $MAILQ_URL, else of DEFAULT_URL."""
        url = url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
        if not isinstance(url, str):
            raise InvalidInput(f"a mailq URL is text, not {type(url).__name__}")
        return _parse(url)

    def shown(self) -> str:
        """The URL as a message shows it."""
        return shown(redact(self.url or self.to_url()))

    def absolute(self) -> Settings:
        """The same settings with the data dir made absolute: what processes started elsewhere (Spark's
        Python workers, a Dagster run) must be handed."""
        if self.data_dir is None:
            return self
        absolute = self.data_dir.resolve()
        return replace(self, data_dir=absolute, url=self.to_url(data_dir=absolute))

    def to_url(self, *, data_dir: Path | None = None) -> str:
        """A URL `from_url` reads back into these settings (it holds no secret: the settings have none)."""
        data_dir = data_dir or self.data_dir
        options: dict[str, str] = {}
        if self.backend == CASSANDRA:
            assert self.cassandra is not None and self.s3 is not None
            cassandra, s3 = self.cassandra, self.s3
            user = f"{cassandra.user}@" if cassandra.user else ""
            hosts = ",".join(f"{_host_text(host)}:{port}" for host, port in cassandra.contact_points)
            head = f"cassandra://{user}{hosts}/{cassandra.keyspace}"
            options["s3"] = s3.bucket
            for name, value in (
                ("s3_endpoint", s3.endpoint),
                ("s3_region", s3.region),
                ("s3_prefix", s3.prefix),
            ):
                if value:
                    options[name] = value
            options["broker"] = _broker_text(self.amqp, data_dir)
            options["consistency"] = cassandra.consistency
            options["replication"] = str(cassandra.replication)
            if cassandra.tls:
                options["tls"] = "on"
            for name in ("ca", "cert", "key"):
                path = getattr(self.tls_files, name)
                if path is not None:
                    options[name] = str(path)
        else:
            head = f"embedded://{data_dir}"
        defaults = Settings(backend=self.backend)
        for name in ("visibility_timeout", "clock_skew_grace"):
            if getattr(self, name) != getattr(defaults, name):
                options[name] = f"{getattr(self, name)}us"
        if self.max_message_size != defaults.max_message_size:
            options["max_message_size"] = str(self.max_message_size)
        if self.durability != defaults.durability:
            options["durability"] = self.durability
        for name, value in (self.view_configuration or {}).items():
            options[name] = f"{value}us" if name == "slice_window" else str(value)
        return head + (f"?{urlencode(options, safe=':/@,')}" if options else "")


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _broker_text(amqp: AmqpSettings | None, data_dir: Path | None) -> str:
    if amqp is None:
        return f"embedded:{data_dir}"
    user = f"{amqp.user}@" if amqp.user else ""
    vhost = "" if amqp.vhost == "/" else quote(amqp.vhost, safe="")
    hosts = ",".join(f"{_host_text(host)}:{port}" for host, port in amqp.hosts)
    queues = "" if amqp.queues == "classic" else f"?queues={amqp.queues}"
    return f"{'amqps' if amqp.tls else 'amqp'}://{user}{hosts}/{vhost}{queues}"


# Parsing ----------------------------------------------------------------------------------------------------


def _refuse_password(url: str, whole: str, what: str = "the mailq URL") -> None:
    userinfo = userinfo_of(split_authority(url)[1])
    if userinfo is not None and ":" in userinfo:
        raise InvalidInput(
            f"{what} {shown(redact(whole))} carries a password: a mailq URL never does, "
            "passwords and keys come from the environment"
        )


def _parse(url: str) -> Settings:
    _refuse_password(url, url)
    head, authority, tail = split_authority(url)
    scheme = head.removesuffix("://")
    if not head or scheme not in OPTIONS:
        raise InvalidInput(
            f"unsupported mailq URL scheme {shown(scheme or url)} in {shown(redact(url))}: expected "
            "'embedded://<data dir>' or 'cassandra://host[:port][,host...]/<keyspace>?s3=<bucket>&broker=...'"
        )
    if "#" in tail:
        raise InvalidInput(f"invalid mailq URL {shown(redact(url))}: a mailq URL has no '#' fragment")
    path, _, query = tail.partition("?")
    options = _options(query, scheme, url)
    if scheme == EMBEDDED:
        if userinfo_of(authority) is not None:
            raise InvalidInput(
                f"the embedded URL {shown(redact(url))} takes no user name: expected 'embedded://<data dir>'"
            )
        if "[" in authority or "]" in authority:
            raise InvalidInput(f"invalid mailq URL {shown(redact(url))}: '[' or ']' in its data dir")
        data_dir = Path(authority + path) if authority + path else Path(".mailq")
        return Settings(backend=EMBEDDED, data_dir=data_dir, url=url, **_queue_values(options))
    return _cassandra(url, authority, path, options)


def _options(query: str, scheme: str, url: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise InvalidInput(
            f"invalid mailq URL {shown(redact(url))}: its options are not name=value"
        ) from None
    known = OPTIONS[scheme]
    unknown = {name for name, _ in pairs} - set(known)
    if unknown:
        raise InvalidInput(
            f"unknown mailq URL option(s) {', '.join(shown(name) for name in sorted(unknown))} "
            f"for {scheme}://: known are {sorted(known)}"
        )
    options: dict[str, str] = {}
    for name, value in pairs:
        if name in options:
            raise InvalidInput(f"the mailq URL option {name} is given twice in {shown(redact(url))}")
        if not value:
            raise InvalidInput(f"the mailq URL option {name} has no value in {shown(redact(url))}")
        options[name] = value
    return options


def _queue_values(options: dict[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in ("visibility_timeout", "clock_skew_grace"):
        if name in options:
            values[name] = parse_duration(options[name], name)
    if "max_message_size" in options:
        values["max_message_size"] = parse_count(options["max_message_size"], "max_message_size")
    if "durability" in options:
        values["durability"] = choice(options["durability"], "durability", DURABILITIES)
    changes: dict[str, int] = {}
    if "slice_window" in options:
        changes["slice_window"] = parse_duration(options["slice_window"], "slice_window")
    for name in ("bucket_count", "update_browse_start_pace"):
        if name in options:
            changes[name] = parse_count(options[name], name)
    if changes:
        QueueViewConfiguration(**changes)  # validates the values; the rules on changes apply when registered
        values["view_configuration"] = changes
    return values


def _user(authority: str, url: str) -> tuple[str | None, str]:
    userinfo = userinfo_of(authority)
    hosts = authority.rpartition("@")[2]
    if userinfo is None:
        return None, hosts
    if not USER.fullmatch(userinfo):
        raise InvalidInput(f"invalid user name {shown(userinfo)} in {shown(redact(url))}")
    return unquote(userinfo), hosts


def _cassandra(url: str, authority: str, path: str, options: dict[str, str]) -> Settings:
    user, hosts = _user(authority, url)
    if not hosts:
        raise InvalidInput(
            f"the cassandra URL {shown(redact(url))} names no host: expected cassandra://host/<keyspace>"
        )
    contact_points = tuple(host_port(host, "Cassandra host", CASSANDRA_PORT) for host in hosts.split(","))
    if path in ("", "/"):
        raise InvalidInput(
            f"the cassandra URL {shown(redact(url))} names no keyspace: expected cassandra://host/<keyspace>"
        )
    keyspace = matching(
        KEYSPACE,
        path.removeprefix("/"),
        "keyspace",
        "cassandra://host/<keyspace>, a keyspace of lower-case letters, digits and _ (at most 48, "
        "starting with a letter)",
    )
    for required, example in (
        ("s3", "s3=<bucket>"),
        ("broker", "broker=embedded:<dir> or broker=amqp://host/<vhost>"),
    ):
        if required not in options:
            raise InvalidInput(f"the cassandra URL {shown(redact(url))} needs the option {example}")
    cassandra = CassandraSettings(
        contact_points=contact_points,
        keyspace=keyspace,
        user=user,
        consistency=choice(
            options.get("consistency", DEFAULT_CONSISTENCY), "consistency", CONSISTENCY_LEVELS, str.upper
        ),
        replication=parse_count(options.get("replication", "1"), "replication"),
        tls=choice(options.get("tls", "off"), "tls", ("on", "off"), str.lower) == "on",
    )
    amqp, data_dir = _broker(options["broker"], url)
    s3 = _s3(options)
    return Settings(
        backend=CASSANDRA,
        data_dir=data_dir,
        cassandra=cassandra,
        s3=s3,
        amqp=amqp,
        tls_files=tls_files(
            options,
            cassandra_tls=cassandra.tls,
            s3_endpoint=s3.endpoint,
            broker_tls=None if amqp is None else amqp.tls,
        ),
        url=url,
        **_queue_values(options),
    )


def _s3(options: dict[str, str]) -> S3Settings:
    endpoint = options.get("s3_endpoint")
    if endpoint is not None:
        _refuse_password(endpoint, endpoint, "the s3_endpoint")
        head, authority, tail = split_authority(endpoint)
        if head not in ("http://", "https://") or not authority or tail not in ("", "/") or "@" in authority:
            raise InvalidInput(
                f"invalid s3_endpoint {shown(redact(endpoint))}: expected http[s]://host[:port], "
                "with no credentials (they come from the AWS chain)"
            )
        host_port(authority, "s3_endpoint host", 443 if head == "https://" else 80)
    return S3Settings(
        bucket=matching(BUCKET, options["s3"], "s3 bucket", "an S3 bucket name (3-63 of a-z, 0-9, '.', '-')"),
        endpoint=endpoint,
        region=matching(REGION, options["s3_region"], "s3_region", "a region such as us-east-1")
        if "s3_region" in options
        else None,
        prefix=matching(
            PREFIX, options["s3_prefix"], "s3_prefix", "a key prefix without '//' or a leading '/'"
        )
        if "s3_prefix" in options
        else "",
    )


def _broker(value: str, url: str) -> tuple[AmqpSettings | None, Path | None]:
    """The broker option: `embedded:<dir>` (the embedded broker's data dir) or an amqp:// URL."""
    if value.startswith("embedded:") and not value.startswith("embedded://"):
        directory = value.removeprefix("embedded:")
        return None, Path(directory)
    expected = "amqp[s]://[user@]host[:port][,host[:port]...]/<vhost>[?queues=classic|quorum]"
    tls = value.startswith("amqps://")
    if not value.startswith("amqp://") and not tls:
        raise InvalidInput(f"invalid broker {shown(redact(value))}: expected embedded:<dir> or {expected}")
    _refuse_password(value, url, "the broker URL in")
    _, authority, tail = split_authority(value)
    user, hosts = _user(authority, value)
    path, question, query = tail.partition("?")
    if "#" in tail or not hosts:
        raise InvalidInput(f"invalid broker {shown(redact(value))}: expected {expected}")
    default_port = AMQPS_PORT if tls else AMQP_PORT
    (host, port), *more_hosts = (host_port(one, "broker host", default_port) for one in hosts.split(","))
    vhost = unquote(path.removeprefix("/")) or "/"
    matching(VHOST, vhost, "broker vhost", "printable ASCII")
    options = _broker_options(query, value) if question else {}
    queues = choice(options.get("queues", "classic"), "broker queues", BROKER_QUEUE_TYPES, str.lower)
    amqp = AmqpSettings(host, port, vhost, user, more_hosts=tuple(more_hosts), queues=queues, tls=tls)
    return amqp, None


def _broker_options(query: str, value: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise InvalidInput(f"invalid broker {shown(redact(value))}: its options are not name=value") from None
    options = dict(pairs)
    unknown = sorted(set(options) - set(BROKER_OPTIONS))
    if unknown or len(options) != len(pairs):
        raise InvalidInput(
            f"invalid broker {shown(redact(value))}: unknown or repeated option(s) "
            f"{', '.join(shown(name) for name in unknown) or 'given twice'}: known are {list(BROKER_OPTIONS)}"
        )
    return options
