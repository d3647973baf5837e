"""The mailq URL of a distributed deployment on the harness's servers."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlencode

if TYPE_CHECKING:
    from .cassandra import CassandraServer
    from .cassandra_cluster import CassandraClusterServer
    from .s3 import S3Server


def distributed_url(
    cassandra: CassandraServer | CassandraClusterServer,
    s3: S3Server,
    keyspace: str,
    bucket: str,
    broker: str,
    **options: object,
) -> str:
    """Keyspace `keyspace` on the harness's Cassandra (its single node, or every node of its cluster:
    `replication=3` in `options` replicates the keyspace on each), bucket `bucket` on its S3 endpoint, and
    `broker` (`embedded:<dir>` or `amqp[s]://...`); `options` are the URL's other options. A Cassandra
    that speaks TLS adds `tls=on` and the harness's CA and client certificate."""
    tls = cassandra.tls.url_options() if cassandra.tls is not None else {}
    query = urlencode(
        {
            "s3": bucket,
            "s3_endpoint": s3.endpoint_url,
            "s3_region": s3.region,
            "broker": broker,
            **tls,
            **options,
        },
        safe=":/",
    )
    return f"cassandra://{cassandra.contact_points}/{keyspace}?{query}"
