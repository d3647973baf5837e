"""Blob content in an S3 bucket, through boto3: AWS, MinIO, Ceph, versitygw or any other S3 API.

One object per blob, keyed `<prefix><blob id>` (`g7_<64 hex>`): flat keys with no `/` of their own, so no
server needs folder semantics and no key is ever another key's "folder" (versitygw and other file-backed
servers refuse both). Credentials come only from the standard AWS chain (environment, profile, instance
role), never from arguments, so no repr, error or log of this store can hold them.
"""

from __future__ import annotations

import base64
import io
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import urlsplit

import boto3
import botocore.loaders
import botocore.session
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
    SSLError,
)

from ..errors import BlobNotFound, BlobStoreUnavailable, InvalidInput, NoStore
from ..model import BlobId
from ..tls import TlsFiles, tls_failure
from .store import distinct_ids

MIB = 1024 * 1024
#: From this size a put is a multipart upload (boto3's transfer manager): parts of this size are sent in
#: parallel and retried one by one, instead of one request that starts over on any failure.
MULTIPART_THRESHOLD = 8 * MIB
#: DeleteObjects takes at most 1000 keys a request; ListObjectsV2 returns at most 1000 keys a page.
DELETE_BATCH = 1000
LIST_PAGE = 1000
#: A few application threads, each possibly running a multipart upload of MULTIPART_CONCURRENCY parts,
#: share the client's pool; urllib3 opens and drops extra connections beyond it.
MAX_POOL_CONNECTIONS = 32
MULTIPART_CONCURRENCY = 4
CONNECT_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 60
#: Integrity of every put: the server refuses content that does not match this checksum of it; gets ask
#: for it back and boto3 checks what it read. A single put sends it as a header of its own
#: (`_crc32`): over https boto3 would send it as an aws-chunked trailer, which versitygw 1.8 leaves
#: partly unread on a kept-alive connection, failing the next request there with BadRequest.
CHECKSUM = "CRC32"

_MODELS = botocore.loaders.create_loader()
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# AWS's "safe characters" for keys: the prefix is part of every key and must mean the same on every server.
_PREFIX = re.compile(r"(?!/)(?!.*//)[A-Za-z0-9!_.*'()/-]{0,512}")
_MISSING_BLOB = {"NoSuchKey"}
_MISSING_BUCKET = {"NoSuchBucket", "404", "NotFound"}
_MISSING_ON_HEAD = {"404", "NotFound", "NoSuchKey"}
_REFUSED = {
    "403",
    "AccessDenied",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidToken",
    "SignatureDoesNotMatch",
}


class S3BlobStore:
    """The BlobStore protocol on one bucket (under an optional key prefix), with one thread-safe boto3
    client: share one store between threads."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        prefix: str = "",
        max_attempts: int = 5,
        tls: TlsFiles | None = None,
    ) -> None:
        """`endpoint_url` None is AWS itself; `region` None takes the AWS chain's (AWS_DEFAULT_REGION, the
        profile). `max_attempts` counts the first try; retries back off exponentially (standard mode).
        `tls` names the CA that verifies an https endpoint (the system's without it) and a client
        certificate to present."""
        if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise InvalidInput(
                f"invalid S3 bucket name {bucket!r}: expected 3-63 lowercase letters, digits, '.' or '-'"
            )
        # File-backed servers map `/` to directories: a `.` or `..` folder would not mean the same there.
        if (
            not isinstance(prefix, str)
            or not _PREFIX.fullmatch(prefix)
            or any(folder in (".", "..") for folder in prefix.split("/")[:-1])
        ):
            raise InvalidInput(
                f"invalid S3 key prefix {prefix!r}: expected up to 512 letters, digits and !_.*'()/- "
                "with no leading '/', no '//' and no '.' or '..' folder"
            )
        if endpoint_url is not None:
            _check_endpoint(endpoint_url)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput(f"invalid max_attempts {max_attempts!r}: expected an integer >= 1")
        self.bucket = bucket
        self.prefix = prefix
        self.region = region
        self.endpoint = endpoint_url or (f"AWS S3 ({region})" if region else "AWS S3")
        config = Config(
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            read_timeout=READ_TIMEOUT_SECONDS,
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            max_pool_connections=MAX_POOL_CONNECTIONS,
            request_checksum_calculation="when_supported",
            response_checksum_validation="when_supported",
            # Buckets as subdomains of a private endpoint need wildcard DNS that MinIO, Ceph or a test
            # server rarely have; every S3 API serves the path style.
            s3={"addressing_style": "path"} if endpoint_url else None,
            client_cert=None if tls is None or tls.cert is None else (str(tls.cert), str(tls.key)),
        )
        with self._failures("creating the S3 client"):
            # A session per store: sessions are not thread-safe (the client made from one is), and each
            # finds the credentials the AWS chain holds now. They share the loader of botocore's service
            # models, which costs a tenth of a second a session to read again.
            botocore_session = botocore.session.get_session()
            botocore_session.register_component("data_loader", _MODELS)
            self._client = boto3.session.Session(botocore_session=botocore_session).client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                config=config,
                verify=None if tls is None or tls.ca is None else str(tls.ca),
            )
        self._transfer = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD,
            multipart_chunksize=MULTIPART_THRESHOLD,
            max_concurrency=MULTIPART_CONCURRENCY,
            # The classic manager behaves the same everywhere; the CRT one depends on an optional package.
            preferred_transfer_client="classic",
        )

    def __repr__(self) -> str:
        return f"S3BlobStore(bucket={self.bucket!r}, endpoint={self.endpoint!r}, prefix={self.prefix!r})"

    def check(self) -> None:
        """Fail with BlobStoreUnavailable unless the bucket exists and the credentials may use it."""
        with self._failures("checking the bucket"):
            self._client.head_bucket(Bucket=self.bucket)

    def open_bucket(self, create: bool) -> None:
        """Check the bucket is there and usable; with `create`, make it first where it is missing (an
        operator who provisions buckets elsewhere keeps that: an existing bucket is used as it is)."""
        try:
            self.check()
        except BlobStoreUnavailable as error:
            missing = isinstance(error.__cause__, ClientError) and _code(error.__cause__) in _MISSING_BUCKET
            if not missing:
                raise
            if not create:
                raise NoStore(
                    f"no {self._where()}: nothing was created there yet (create the schema first)"
                ) from None
            with self._failures("creating the bucket"):
                try:
                    where = {}
                    if self.region and self.region != "us-east-1":  # AWS's default needs no constraint
                        where = {"CreateBucketConfiguration": {"LocationConstraint": self.region}}
                    self._client.create_bucket(Bucket=self.bucket, **where)
                except ClientError as race:
                    # Another process made it between the check and the create: that is what was asked.
                    if _code(race) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise

    def close(self) -> None:
        self._client.close()

    def put(self, blob_id: BlobId | str, data: bytes) -> None:
        """Idempotent: the key is the blob id, so a repeated put writes the same content again."""
        target = BlobId.parse(blob_id)
        key = self.prefix + str(target)
        with self._failures(f"putting blob {target}"):
            if len(data) < MULTIPART_THRESHOLD:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ChecksumCRC32=_crc32(data))
            else:
                self._client.upload_fileobj(
                    io.BytesIO(data),
                    self.bucket,
                    key,
                    ExtraArgs={"ChecksumAlgorithm": CHECKSUM},
                    Config=self._transfer,
                )

    def put_many(self, contents: Sequence[tuple[BlobId, bytes]]) -> None:
        for blob_id, data in contents:
            self.put(blob_id, data)

    def get(self, blob_id: BlobId | str) -> bytes:
        target = BlobId.parse(blob_id)
        with self._failures(f"getting blob {target}", missing=target):
            response = self._client.get_object(
                Bucket=self.bucket, Key=self.prefix + str(target), ChecksumMode="ENABLED"
            )
            return response["Body"].read()

    def exists(self, blob_id: BlobId | str) -> bool:
        return self._head(BlobId.parse(blob_id))

    def delete(self, blob_id: BlobId | str) -> bool:
        """True if the blob existed: S3 deletes without saying, so a HEAD asks first (one more request;
        a put racing the delete may make the answer stale, never the deletion wrong)."""
        target = BlobId.parse(blob_id)
        if not self._head(target):
            return False
        with self._failures(f"deleting blob {target}"):
            self._client.delete_object(Bucket=self.bucket, Key=self.prefix + str(target))
        return True

    def delete_many(self, blob_ids: Iterable[BlobId | str]) -> int:
        """DeleteObjects in batches of 1000. A failure stops at its batch: the earlier ones are deleted,
        which a retry of the whole call repeats harmlessly."""
        keys = [self.prefix + str(blob_id) for blob_id in distinct_ids(blob_ids)]
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            with self._failures(f"deleting a batch of {len(batch)} blobs"):
                response = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True}
                )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                problem = _problem(first.get("Code", ""), first.get("Message", ""))
                raise BlobStoreUnavailable(
                    f"{self._where()}: {len(errors)} of {len(batch)} blobs not deleted, "
                    f"e.g. key {first.get('Key')!r}: {problem}"
                )
        return len(keys)

    def list_ids(self, starting: str = "") -> Iterator[BlobId]:
        pages = iter(
            self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + starting, PaginationConfig={"PageSize": LIST_PAGE}
            )
        )
        while True:
            # Only the request is guarded: the caller's own errors while it consumes a page pass untouched.
            with self._failures("listing blobs"):
                page = next(pages, None)
            if page is None:
                return
            for item in page.get("Contents", ()):
                name = item["Key"][len(self.prefix) :]
                try:
                    blob_id = BlobId.parse(name)
                except InvalidInput:
                    continue  # another application's object, or another store's under a longer prefix
                if str(blob_id) == name:
                    yield blob_id

    def _head(self, target: BlobId) -> bool:
        with self._failures(f"looking up blob {target}"):
            try:
                self._client.head_object(Bucket=self.bucket, Key=self.prefix + str(target))
                return True
            except ClientError as error:
                if _code(error) not in _MISSING_ON_HEAD:
                    raise
            # A HEAD answer has no body, so a missing bucket looks like a missing blob: ask the bucket.
            self._client.head_bucket(Bucket=self.bucket)
            return False

    def _where(self) -> str:
        return f"S3 bucket {self.bucket!r} at {self.endpoint}"

    @contextmanager
    def _failures(self, doing: str, missing: BlobId | None = None) -> Iterator[None]:
        """botocore's errors as mailq's: a missing blob is BlobNotFound, anything else one
        BlobStoreUnavailable naming the bucket, the endpoint, the problem and what was being done."""
        try:
            yield
        except ClientError as error:
            code = _code(error)
            if missing is not None and code in _MISSING_BLOB:
                raise BlobNotFound(f"blob {missing} not found in {self._where()}") from None
            message = error.response.get("Error", {}).get("Message", "")
            raise BlobStoreUnavailable(f"{self._where()}: {_problem(code, message)} ({doing})") from error
        except NoCredentialsError as error:
            raise BlobStoreUnavailable(
                f"{self._where()}: no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                f"or AWS_PROFILE ({doing})"
            ) from error
        except SSLError as error:
            raise BlobStoreUnavailable(f"{self._where()}: {tls_failure(error) or error} ({doing})") from error
        except (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError) as error:
            raise BlobStoreUnavailable(f"{self._where()}: endpoint unreachable: {error} ({doing})") from error
        except BotoCoreError as error:
            # botocore's messages name variables and URLs, never a credential's value.
            raise BlobStoreUnavailable(f"{self._where()}: {error} ({doing})") from error


def _crc32(data: bytes) -> str:
    """The content's CRC32 as S3's x-amz-checksum-crc32 header gives it: base64 of its 4 bytes."""
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _problem(code: str, message: str) -> str:
    if code in ("NoSuchBucket", "404", "NotFound"):
        return "the bucket does not exist"
    if code in _REFUSED:
        return (
            f"access refused ({code}): check the credentials the AWS chain finds (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE ...) and the bucket's policy"
        )
    return f"{code}: {message}" if message else code


def _check_endpoint(endpoint_url: str) -> None:
    if isinstance(endpoint_url, str) and "@" in endpoint_url:
        # Errors echo the endpoint, so credentials in it would leak: refuse it without echoing it.
        raise InvalidInput("invalid S3 endpoint URL: it holds credentials, which belong in the AWS chain")
    try:
        parts = urlsplit(endpoint_url) if isinstance(endpoint_url, str) else None
        port_ok = parts is not None and (parts.port is None or parts.port > 0)  # a bad port raises ValueError
    except ValueError:
        parts, port_ok = None, False
    if (
        parts is None
        or not port_ok
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise InvalidInput(f"invalid S3 endpoint URL {endpoint_url!r}: expected http(s)://host[:port]")
