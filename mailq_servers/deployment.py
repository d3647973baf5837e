"""A distributed deployment of its own on the harness's servers, for a run that keeps its data afterwards
(`make demo-distributed`): a keyspace, a bucket and a RabbitMQ vhost named alike, and the URL naming them.

`fresh(directory)` removes the deployment whose URL `directory/url` holds (the previous run's), empties
the directory, makes the vhost (the keyspace and the bucket are made by the runtime's creating open) and
writes the new URL there; `discard(directory)` only removes (`make clean`). The servers must be running
(`python -m mailq_servers up`)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from mailq_runtime.settings import Settings

from . import ServerError, running
from .rabbitmq import RabbitMQ, _binary
from .s3 import remove_bucket
from .urls import distributed_url

URL_FILE = "url"
_CREATOR = "mailq-deployment"


def _required(name: str):
    facts = running(name)
    if facts is None:
        raise ServerError(f"{name} is not running: run `python -m mailq_servers up` first")
    return facts


def make(name: str) -> str:
    """Make vhost `name` on the RabbitMQ node, with every permission for its user, and return the URL of
    keyspace `name` (dashes made underscores), bucket `name` and that vhost."""
    cassandra, s3, rabbitmq = _required("cassandra"), _required("s3"), _required("rabbitmq")
    vhost, user, everything = _binary(name), _binary(rabbitmq.username), _binary(".*")
    RabbitMQ().ctl(
        "eval",
        f'ok = rabbit_vhost:add({vhost}, <<"{_CREATOR}">>), '
        f"ok = rabbit_auth_backend_internal:set_permissions({user}, {vhost}, {everything}, {everything}, "
        f'{everything}, <<"{_CREATOR}">>), ok.',
    )
    broker = f"amqp://{rabbitmq.host}:{rabbitmq.port}/{name}"
    return distributed_url(cassandra, s3, name.replace("-", "_"), name, broker)


def remove(url: str) -> None:
    """Drop the keyspace, empty and delete the bucket and delete the vhost of `url`, where they exist."""
    settings = Settings.from_url(url)
    assert settings.cassandra is not None and settings.s3 is not None and settings.amqp is not None
    cluster = _required("cassandra").cluster()
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {settings.cassandra.keyspace}", timeout=120)
    finally:
        cluster.shutdown()
    remove_bucket(_required("s3").client(), settings.s3.bucket)
    _required("rabbitmq")
    vhost = _binary(settings.amqp.vhost)
    RabbitMQ().ctl(
        "eval",
        f'case rabbit_vhost:exists({vhost}) of true -> rabbit_vhost:delete({vhost}, <<"{_CREATOR}">>); '
        "false -> ok end, ok.",
    )


def discard(directory: Path, *, remove: Callable[[str], None] = remove) -> None:
    """Remove the deployment named in `directory` (with `remove`: the host bed's is another), then the
    directory."""
    url_file = directory / URL_FILE
    if url_file.exists():
        remove(url_file.read_text().strip())
    shutil.rmtree(directory, ignore_errors=True)


def fresh(
    directory: Path,
    prefix: str = "mailq-demo",
    *,
    make: Callable[[str], str] = make,
    remove: Callable[[str], None] = remove,
) -> str:
    """Replace the deployment named in `directory` by a new one (see the module; `make` and `remove` are
    the host bed's for a deployment there); returns its URL."""
    discard(directory, remove=remove)
    directory.mkdir(parents=True)
    url = make(f"{prefix}-{int(time.time())}")
    (directory / URL_FILE).write_text(url + "\n")
    return url
