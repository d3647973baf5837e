"""The deployments the benchmarks run on: clients of a URL's Cassandra and S3 configured as the runtime's
store configures its own, and a fresh deployment (embedded or distributed) that the run makes and removes.

Not a benchmark itself; imported by the scripts of this directory.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from cassandra import ConsistencyLevel
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

from mailq_runtime import Runtime
from mailq_runtime.deployments import open_cassandra
from mailq_runtime.settings import CASSANDRA, Settings
from mailq_runtime.stores.cassandra import CassandraStore

REPOSITORY = Path(__file__).resolve().parent.parent


def cassandra_cluster(settings: Settings) -> Cluster:
    """A cluster of the URL's Cassandra with the execution profile and the TLS the runtime's store uses."""
    cassandra = settings.cassandra
    assert cassandra is not None
    level = ConsistencyLevel.name_to_value[cassandra.consistency.upper()]
    local = cassandra.consistency.upper().startswith("LOCAL_")
    serial = ConsistencyLevel.LOCAL_SERIAL if local else ConsistencyLevel.SERIAL
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
        consistency_level=level,
        serial_consistency_level=serial,
        request_timeout=60.0,
    )
    password = cassandra.password()
    return Cluster(
        [host for host, _ in cassandra.contact_points],
        port=cassandra.contact_points[0][1],
        auth_provider=None if cassandra.user is None else PlainTextAuthProvider(cassandra.user, password),
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        ssl_context=settings.tls_files.context() if cassandra.tls else None,
    )


def s3_client(settings: Settings):
    """A boto3 client of the URL's S3 with the runtime's settings (blobs/s3_store.py): path-style
    addressing on a private endpoint, checksums on every put and get, standard retries."""
    s3 = settings.s3
    assert s3 is not None
    config = Config(
        retries={"mode": "standard", "total_max_attempts": 5},
        max_pool_connections=32,
        request_checksum_calculation="when_supported",
        response_checksum_validation="when_supported",
        s3={"addressing_style": "path"} if s3.endpoint else None,
    )
    ca = settings.tls_files.ca
    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name=s3.region,
        config=config,
        verify=None if ca is None else str(ca),
    )


def drop_deployment(session: Session, s3, keyspace: str, bucket: str) -> None:
    """Drop the keyspace; empty and delete the bucket."""
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=180)
    if bucket_exists(s3, bucket):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", ())]
            if keys:
                s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        s3.delete_bucket(Bucket=bucket)


def bucket_exists(s3, bucket: str) -> bool:
    try:
        s3.head_bucket(Bucket=bucket)
    except s3.exceptions.ClientError as error:
        if str(error.response.get("Error", {}).get("Code")) in ("404", "NoSuchBucket", "NotFound"):
            return False
        raise
    return True


@dataclass(frozen=True)
class Deployment:
    url: str
    settings: Settings
    store: CassandraStore | None  # distributed: a session on its keyspace, for loading and the peers' reads

    @property
    def distributed(self) -> bool:
        return self.store is not None

    @property
    def cassandra(self) -> CassandraStore:
        assert self.store is not None
        return self.store

    @property
    def data_dir(self) -> Path:
        """The embedded deployment's data dir."""
        assert self.settings.data_dir is not None and not self.distributed
        return self.settings.data_dir


@contextmanager
def fresh_deployment(label: str, url: str | None) -> Iterator[Deployment]:
    """Without `url`, a fresh embedded data dir inside the repository (same disk as a real one;
    .gitignore'd). With `url`, the deployment it names, which must not exist yet: an embedded data dir,
    or a Cassandra keyspace and S3 bucket (and the embedded broker's directory), made by the runtime's
    creating open. At the end, whatever happens, what the run made is removed: the data dir, or the
    keyspace dropped, the bucket emptied and deleted and the broker's directory removed."""
    if url is None:
        path = Path(tempfile.mkdtemp(prefix=f".bench-{label}-", dir=REPOSITORY))
        url = f"embedded://{path}"
    settings = Settings.from_url(url)
    local = settings.data_dir
    if local is not None and local.exists() and any(local.iterdir()):
        raise SystemExit(f"benchmark: {local} is not empty: give a directory the run may remove at the end")
    try:
        if settings.backend != CASSANDRA:
            assert local is not None
            local.mkdir(parents=True, exist_ok=True)
            yield Deployment(url, settings, None)
        else:
            with _distributed(settings) as store:
                yield Deployment(url, settings, store)
    finally:
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)


@contextmanager
def _distributed(settings: Settings) -> Iterator[CassandraStore]:
    with new_servers(settings):
        Runtime.open(settings.url, create=True).close()
        store = open_cassandra(settings)
        try:
            yield store
        finally:
            store.close()


@contextmanager
def new_servers(settings: Settings) -> Iterator[tuple[Session, Any]]:
    """A session of the URL's Cassandra and a client of its S3, for a keyspace and bucket that must not
    exist yet; at the end, whatever happens, the keyspace is dropped and the bucket emptied and deleted."""
    assert settings.cassandra is not None and settings.s3 is not None
    keyspace, bucket = settings.cassandra.keyspace, settings.s3.bucket
    cluster = cassandra_cluster(settings)
    try:
        session, s3 = cluster.connect(), s3_client(settings)
        if keyspace in cluster.metadata.keyspaces or bucket_exists(s3, bucket):
            raise SystemExit(
                f"benchmark: keyspace {keyspace} or bucket {bucket} exists: give names that do not, as the "
                "run drops them at the end"
            )
        try:
            yield session, s3
        finally:
            drop_deployment(session, s3, keyspace, bucket)
    finally:
        cluster.shutdown()
