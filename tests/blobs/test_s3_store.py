"""What only the S3 store has: its keys, multipart uploads and checksums as the server sees them, and its
errors when the bucket, the credentials or the endpoint are wrong (clear, and never holding a secret)."""

from __future__ import annotations

import base64
import io
import socket
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from mailq_runtime import BlobNotFound, BlobStoreUnavailable, InvalidInput
from mailq_runtime.blobs.s3_store import MULTIPART_THRESHOLD, S3BlobStore

from .conftest import blob_id, s3_store, use_credentials


def every_operation(store: S3BlobStore):
    target = blob_id(b"content")
    return {
        "put": lambda: store.put(target, b"content"),
        "large put": lambda: store.put(blob_id(b"large"), b"x" * MULTIPART_THRESHOLD),
        "get": lambda: store.get(target),
        "exists": lambda: store.exists(target),
        "delete": lambda: store.delete(target),
        "delete_many": lambda: store.delete_many([target]),
        "list_ids": lambda: list(store.list_ids()),
        "check": store.check,
    }


def shown(error: BaseException) -> str:
    """Everything a person could see of an error: its text, its repr and its traceback with the causes."""
    return f"{error}\n{error!r}\n{''.join(traceback.format_exception(error))}"


def test_keys_are_the_prefix_and_the_blob_id(s3_server, s3_bucket, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    store = s3_store(s3_server, s3_bucket, prefix="flat/keys-")
    ids = [blob_id(b"one"), blob_id(b"two", generation=12)]
    for target in ids:
        store.put(target, b"data")
    listed = s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="flat/")["Contents"]
    assert sorted(item["Key"] for item in listed) == sorted(f"flat/keys-{target}" for target in ids)


def test_prefixes_keep_stores_apart_and_foreign_objects_unlisted(s3_server, s3_bucket, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    left, right = (
        s3_store(s3_server, s3_bucket, prefix="apart"),
        s3_store(s3_server, s3_bucket, prefix="apart/r/"),
    )
    left.put(blob_id(b"left"), b"left")
    right.put(blob_id(b"right"), b"right")
    client = s3_server.client()
    for key in ("apart/r/README", "apartg01_" + "a" * 64, f"apart/r/{blob_id(b'x')}.tmp"):
        client.put_object(Bucket=s3_bucket, Key=key, Body=b"not a blob")
    assert list(left.list_ids()) == [blob_id(b"left")]
    assert list(right.list_ids()) == [blob_id(b"right")]
    assert not left.exists(blob_id(b"right"))
    assert right.delete_many([blob_id(b"left"), blob_id(b"right")]) == 2
    assert left.get(blob_id(b"left")) == b"left"


def test_listing_reads_pages_and_deleting_sends_batches_of_a_thousand(s3_server, s3_bucket, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    store = s3_store(s3_server, s3_bucket)
    stored = [blob_id(f"blob {n}".encode()) for n in range(1001)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda target: store.put(target, b"x"), stored))
    never_put = [blob_id(f"never {n}".encode()) for n in range(1500)]
    requests = []
    store._client.meta.events.register(
        "before-parameter-build.s3.*", lambda params, model, **_: requests.append((model.name, params))
    )
    assert sorted(store.list_ids()) == sorted(stored)
    assert [name for name, _ in requests] == ["ListObjectsV2", "ListObjectsV2"]
    requests.clear()
    # The server at hand takes more than 1000 keys a request; AWS refuses them.
    assert store.delete_many(stored + never_put) == 2501
    assert [(name, len(params["Delete"]["Objects"])) for name, params in requests] == [
        ("DeleteObjects", 1000),
        ("DeleteObjects", 1000),
        ("DeleteObjects", 501),
    ]
    assert list(store.list_ids()) == []


def test_puts_carry_a_checksum_the_server_keeps(s3_server, s3_bucket, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    store = s3_store(s3_server, s3_bucket)
    content = b"checked on arrival"
    store.put(blob_id(content), content)
    head = s3_server.client().head_object(
        Bucket=s3_bucket, Key=f"{store.prefix}{blob_id(content)}", ChecksumMode="ENABLED"
    )
    assert head["ChecksumCRC32"] == base64.b64encode(zlib.crc32(content).to_bytes(4, "big")).decode()


def test_content_altered_on_the_way_is_refused(s3_server, s3_bucket, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    store = s3_store(s3_server, s3_bucket)
    content = b"the original" * 100

    def alter(request, **_):
        request.body = io.BytesIO(b"X" + request.body.read()[1:])

    # After signing and checksumming, as a faulty network or proxy would. Over plain http botocore also
    # signs the payload's SHA-256, which the server checks first; over https the CRC32 alone guards it.
    store._client.meta.events.register("before-send.s3.PutObject", alter)
    with pytest.raises(BlobStoreUnavailable, match=f"{s3_bucket}.*putting blob"):
        store.put(blob_id(content), content)
    assert not store.exists(blob_id(content))


def test_a_blob_from_the_threshold_on_is_a_multipart_upload(s3_server, s3_bucket, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    store = s3_store(s3_server, s3_bucket)
    below, at = b"b" * (MULTIPART_THRESHOLD - 1), b"a" * MULTIPART_THRESHOLD + b"and a second part"
    store.put(blob_id(below), below)
    store.put(blob_id(at), at)
    client = s3_server.client()

    def etag(content: bytes) -> str:
        return client.head_object(Bucket=s3_bucket, Key=f"{store.prefix}{blob_id(content)}")["ETag"]

    # A multipart upload's ETag is "<md5 of the parts' md5s>-<number of parts>".
    assert etag(at).endswith('-2"')
    assert "-" not in etag(below)
    assert store.get(blob_id(at)) == at
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_a_wrong_secret_is_a_clear_error_without_the_secret(s3_server, s3_bucket, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    store = s3_store(s3_server, s3_bucket)  # the right keys: a blob for the refused store to look for
    store.put(blob_id(b"content"), b"content")
    wrong = "wrong" + s3_server.secret_access_key[5:]
    use_credentials(monkeypatch, s3_server, secret=wrong)
    refused = S3BlobStore(
        s3_bucket, endpoint_url=s3_server.endpoint_url, region=s3_server.region, prefix=store.prefix
    )
    for name, operation in every_operation(refused).items():
        with pytest.raises(BlobStoreUnavailable) as caught:
            operation()
        text = shown(caught.value)
        assert f"S3 bucket {s3_bucket!r} at {s3_server.endpoint_url}: access refused" in str(
            caught.value
        ), name
        assert "AWS_SECRET_ACCESS_KEY" in str(caught.value), name
        assert wrong not in text and s3_server.secret_access_key not in text, name
    assert wrong not in repr(refused)
    assert store.get(blob_id(b"content")) == b"content"


def test_a_missing_bucket_is_a_clear_error(s3_server, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    missing = f"mailq-missing-{blob_id(b'bucket').hash[:12]}"
    store = s3_store(s3_server, missing)
    for name, operation in every_operation(store).items():
        # Not BlobNotFound nor "does not exist": the blob is not the problem, the bucket is.
        with pytest.raises(BlobStoreUnavailable) as caught:
            operation()
        assert f"S3 bucket {missing!r} at {s3_server.endpoint_url}: the bucket does not exist" in str(
            caught.value
        ), name
        assert s3_server.secret_access_key not in shown(caught.value), name
    assert missing not in {bucket["Name"] for bucket in s3_server.client().list_buckets()["Buckets"]}


def test_an_unreachable_endpoint_is_a_clear_error(s3_bucket, s3_server, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{unused.getsockname()[1]}"
    store = S3BlobStore(s3_bucket, endpoint_url=endpoint, region="us-east-1", max_attempts=1)
    with pytest.raises(
        BlobStoreUnavailable, match=f"S3 bucket '{s3_bucket}' at {endpoint}: endpoint unreachable"
    ):
        store.get(blob_id(b"anything"))
    with pytest.raises(BlobStoreUnavailable, match="endpoint unreachable.*putting blob"):
        store.put(blob_id(b"anything"), b"anything")


def test_no_credentials_is_a_clear_error(s3_server, s3_bucket, monkeypatch, tmp_path):
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = s3_store(s3_server, s3_bucket)
    with pytest.raises(BlobStoreUnavailable, match="no credentials found: set AWS_ACCESS_KEY_ID"):
        store.put(blob_id(b"anything"), b"anything")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"bucket": "Upper"}, "invalid S3 bucket name 'Upper'"),
        ({"bucket": "a"}, "invalid S3 bucket name 'a'"),
        ({"bucket": "a..b"}, "invalid S3 bucket name 'a..b'"),
        ({"prefix": "/lead"}, "invalid S3 key prefix '/lead'"),
        ({"prefix": "a//b"}, "invalid S3 key prefix 'a//b'"),
        ({"prefix": "sp ace"}, "invalid S3 key prefix 'sp ace'"),
        ({"prefix": "../up/"}, "invalid S3 key prefix '../up/'"),
        ({"prefix": "a/./b"}, "invalid S3 key prefix 'a/./b'"),
        ({"endpoint_url": "127.0.0.1:9000"}, "invalid S3 endpoint URL '127.0.0.1:9000'"),
        ({"endpoint_url": "ftp://host"}, "invalid S3 endpoint URL 'ftp://host'"),
        ({"endpoint_url": "http://host:port"}, "invalid S3 endpoint URL 'http://host:port'"),
        ({"endpoint_url": "http://host/bucket"}, "invalid S3 endpoint URL 'http://host/bucket'"),
        ({"max_attempts": 0}, "invalid max_attempts 0"),
    ],
)
def test_bad_arguments_are_refused(arguments, message):
    arguments = {"bucket": "mailq-blobs", **arguments}
    with pytest.raises(InvalidInput, match=f"^{message}"):
        S3BlobStore(**arguments)


def test_credentials_in_the_endpoint_url_are_refused_without_echoing_them():
    with pytest.raises(InvalidInput) as caught:
        S3BlobStore("mailq-blobs", endpoint_url="http://key:s3cr3t@127.0.0.1:9000")
    # Not `shown`: its traceback quotes this test's own source line.
    assert "s3cr3t" not in f"{caught.value}{caught.value!r}"
    assert caught.value.__context__ is None
    assert "holds credentials" in str(caught.value)


def test_a_missing_blob_names_the_blob_and_the_bucket(s3_server, s3_bucket, monkeypatch):
    use_credentials(monkeypatch, s3_server)
    store = s3_store(s3_server, s3_bucket)
    missing = blob_id(b"absent")
    with pytest.raises(BlobNotFound) as caught:
        store.get(missing)
    assert (
        str(caught.value)
        == f"blob {missing} not found in S3 bucket {s3_bucket!r} at {s3_server.endpoint_url}"
    )
    assert repr(store) == (
        f"S3BlobStore(bucket={s3_bucket!r}, endpoint={s3_server.endpoint_url!r}, prefix={store.prefix!r})"
    )
