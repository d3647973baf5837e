"""The blob stores under test, one fixture for all three: the file system, the embedded SQLite file and an
S3 bucket on the harness's endpoint (a fresh key prefix per test in the session's bucket)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailq_runtime.blobs.s3_store import S3BlobStore
from mailq_runtime.blobs.sqlite_store import SqliteBlobStore
from mailq_runtime.blobs.store import BlobStore
from mailq_runtime.model import BlobId
from mailq_runtime.stores.embedded import EmbeddedStore
from mailq_servers.s3 import S3Server


def blob_id(content: bytes, generation: int = 1) -> BlobId:
    return BlobId(generation, hashlib.sha256(content).hexdigest())


def use_credentials(monkeypatch: pytest.MonkeyPatch, s3_server: S3Server, secret: str | None = None) -> None:
    """The harness's keys (or another secret) where the AWS chain looks first, and nothing else there that
    could sign requests instead."""
    for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret or s3_server.secret_access_key)


@pytest.fixture(scope="session")
def s3_bucket(s3_server: S3Server, bucket_name: str) -> str:
    """The session's bucket, created (the harness's fixture only names it and removes it at the end)."""
    client = s3_server.client()
    try:
        client.create_bucket(Bucket=bucket_name)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass  # a runtime of an earlier test in this session made it
    client.close()
    return bucket_name


def s3_store(s3_server: S3Server, bucket: str, **options) -> S3BlobStore:
    options.setdefault("prefix", f"t{secrets.token_hex(4)}/")
    return S3BlobStore(bucket, endpoint_url=s3_server.endpoint_url, region=s3_server.region, **options)


def files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.fixture(params=["sqlite", "s3"])
def store(request, tmp_path, monkeypatch) -> Iterator[BlobStore]:
    """The store under test, with the probe `.everything_stored()`: all its storage holds, blobs or not
    (the files under its directory; every key of the bucket), to show that an operation changed nothing."""
    if request.param == "sqlite":
        embedded = EmbeddedStore(tmp_path / "db")
        blobs = SqliteBlobStore(embedded)
        blobs.everything_stored = lambda: [
            *files_under(tmp_path),
            *embedded.read("SELECT * FROM blob_content"),
        ]
        yield blobs
        embedded.close()
    else:
        s3_server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        use_credentials(monkeypatch, s3_server)
        blobs = s3_store(s3_server, bucket)
        client = s3_server.client()
        blobs.everything_stored = lambda: [
            (item["Key"], item["ETag"])
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for item in page.get("Contents", ())
        ]
        yield blobs
        blobs.close()
        client.close()
