"""The S3 blob store through an outage, at each of its calls: with the cable to the endpoint pulled
(tests/forwarder.py), every call raises BlobStoreUnavailable chained to botocore's error, in one line
naming the bucket, the endpoint and what was being done, and the bucket holds what it held."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from mailq_runtime.blobs.s3_store import MULTIPART_THRESHOLD, S3BlobStore
from mailq_runtime.errors import BlobStoreUnavailable
from mailq_servers.s3 import S3Server
from tests.forwarder import Forwarder

from .conftest import blob_id, use_credentials

KEPT = b"kept content"
LARGE = secrets.token_bytes(MULTIPART_THRESHOLD)  # a multipart upload
CALLS: dict[str, Callable[[S3BlobStore], object]] = {
    "check": lambda store: store.check(),
    "open_bucket": lambda store: store.open_bucket(create=True),
    "put": lambda store: store.put(blob_id(b"new"), b"new"),
    "put multipart": lambda store: store.put(blob_id(LARGE), LARGE),
    "get": lambda store: store.get(blob_id(KEPT)),
    "exists": lambda store: store.exists(blob_id(KEPT)),
    "delete": lambda store: store.delete(blob_id(KEPT)),
    "delete_many": lambda store: store.delete_many([blob_id(KEPT)]),
    "list_ids": lambda store: list(store.list_ids()),
}


@pytest.fixture
def cable(s3_server: S3Server) -> Iterator[Forwarder]:
    endpoint = urlsplit(s3_server.endpoint_url)
    with Forwarder(endpoint.hostname, endpoint.port) as forwarder:
        yield forwarder


@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_outage_is_blob_store_unavailable_at_each_call(s3_server, s3_bucket, monkeypatch, cable, call):
    use_credentials(monkeypatch, s3_server)
    prefix = f"t{secrets.token_hex(4)}/"
    direct, wired = (
        S3BlobStore(s3_bucket, endpoint_url=endpoint, region=s3_server.region, prefix=prefix)
        for endpoint in (s3_server.endpoint_url, f"http://127.0.0.1:{cable.port}")
    )
    try:
        direct.put(blob_id(KEPT), KEPT)
        cable.cut()
        with pytest.raises(BlobStoreUnavailable) as raised:
            CALLS[call](wired)
        assert isinstance(raised.value.__cause__, BotoCoreError | ClientError), repr(raised.value.__cause__)
        message = str(raised.value)
        assert message.startswith(f"S3 bucket {s3_bucket!r} at http://127.0.0.1:{cable.port}: ")
        assert "\n" not in message
        assert list(direct.list_ids()) == [blob_id(KEPT)]
    finally:
        cable.restore()
        direct.delete_many(direct.list_ids())
        direct.close()
        wired.close()
