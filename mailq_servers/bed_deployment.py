"""A deployment of its own on the host bed (host_bed.py): a keyspace replicated on the three Cassandra
nodes, a bucket on the objects host and a RabbitMQ vhost whose mail queues are quorum queues, named alike,
and the mailq URL that names them by the hosts' addresses (which every host and this machine reach).

`make(bed, name)` makes the vhost, with every permission for the bed's user (the runtime's creating open
makes the keyspace and the bucket) and returns the URL; `remove(bed, url)` drops all three where they
exist. A process that opens the URL needs `HostBedServers.env()` too: the AMQP password and S3 keys."""

from __future__ import annotations

from mailq_runtime.settings import Settings

from .host_bed import HostBed, running_facts
from .s3 import remove_bucket
from .urls import distributed_url

REPLICATION = 3


def make(bed: HostBed, name: str) -> str:
    """The URL of keyspace `name` (dashes made underscores), bucket `name` and vhost `name` on the bed."""
    facts = running_facts()
    bed.rabbitmq.ctl("add_vhost", name)
    bed.rabbitmq.ctl("set_permissions", "-p", name, facts.rabbitmq_cluster.username, ".*", ".*", ".*")
    broker = facts.rabbitmq_cluster.broker_url(name, queues="quorum")
    return distributed_url(
        facts.cassandra_cluster,
        facts.s3_server,
        name.replace("-", "_"),
        name,
        broker,
        replication=REPLICATION,
    )


def remove(bed: HostBed, url: str) -> None:
    """Drop the keyspace, empty and delete the bucket and delete the vhost of `url`, where they exist."""
    settings = Settings.from_url(url)
    assert settings.cassandra is not None and settings.s3 is not None and settings.amqp is not None
    facts = running_facts()
    cluster = facts.cassandra_cluster.cluster()
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {settings.cassandra.keyspace}", timeout=120)
    finally:
        cluster.shutdown()
    remove_bucket(facts.s3_server.client(), settings.s3.bucket)
    if settings.amqp.vhost in bed.rabbitmq.ctl("list_vhosts", "name").split():
        bed.rabbitmq.ctl("delete_vhost", settings.amqp.vhost)
