"""Where the pipeline's outputs are: a directory of this machine (the embedded deployment's), or an
`s3a://` location in the deployment's object store, which a Spark cluster's driver and workers reach
without sharing a disk. Spark writes and reads them through Hadoop (s3a.py); the rest of the pipeline and
the command line list and read the Parquet records with pyarrow, and put and get the small JSON values
with boto3, reaching the object store as the deployment does."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pyarrow.fs as pafs
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from mailq_runtime.errors import InvalidInput, StoreUnusable, shown
from mailq_runtime.settings import S3Settings, Settings

from . import s3a

PROBE = ".mailq-write-probe"


@dataclass(frozen=True)
class Outputs:
    """`base`, a directory or an s3a:// URI, and for the latter the deployment's object store: its
    endpoint and region (`s3`) and the CA that verifies it (`ca`)."""

    base: str
    s3: S3Settings | None = None
    ca: Path | None = None

    @classmethod
    def of(cls, base: str, settings: Settings) -> Outputs:
        outputs = cls(base, settings.s3, settings.tls_files.ca)
        if s3a.is_s3a(base):
            s3a.bucket_of(base)  # a location with no bucket is refused before anything runs
            if settings.s3 is None:
                raise InvalidInput(
                    f"the pipeline's outputs at {shown(base)} need an object store, and the deployment of "
                    f"{settings.shown()} has none: give a directory instead"
                )
        return outputs

    def path(self, *parts: str) -> str:
        return "/".join([self.base.rstrip("/"), *parts])

    def filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """pyarrow's file system holding `location` (a path under `base`), and the path on it."""
        if not s3a.is_s3a(location):
            return pafs.LocalFileSystem(), location
        assert self.s3 is not None  # `of` refuses an s3a:// base without an object store
        endpoint = urlsplit(self.s3.endpoint) if self.s3.endpoint else None
        # Credentials from the AWS chain, as the deployment's own S3 client takes them.
        system = pafs.S3FileSystem(
            region=s3a.region(self.s3),
            endpoint_override=endpoint.netloc if endpoint else None,
            scheme=endpoint.scheme if endpoint else "https",
            tls_ca_file_path=str(self.ca) if self.ca is not None else None,
        )
        return system, location[len(s3a.SCHEME) :]

    def write(self, location: str, data: bytes) -> None:
        """`data` as the file or object at `location`: a file private to its owner whatever the umask, as
        Spark's outputs are (resources/spark.py); an object in one put (object storage has no modes)."""
        if s3a.is_s3a(location):
            bucket, key = self._object(location)
            self._s3("written", lambda client: client.put_object(Bucket=bucket, Key=key, Body=data))
            return
        os.makedirs(os.path.dirname(location), mode=0o700, exist_ok=True)
        with os.fdopen(os.open(location, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as output:
            output.write(data)

    def read(self, location: str) -> bytes:
        if s3a.is_s3a(location):
            bucket, key = self._object(location)
            answer = self._s3("read", lambda client: client.get_object(Bucket=bucket, Key=key))
            return answer["Body"].read()
        return Path(location).read_bytes()

    def check_writable(self) -> None:
        """Write and delete a probe under an s3a:// base, so that a bucket that is missing, or that the
        credentials may not write, fails before a run starts, naming the place (StoreUnusable), rather
        than at a run's first output. A directory is Spark's to make."""
        if not s3a.is_s3a(self.base):
            return
        probe = self.path(PROBE)
        self.write(probe, b"")
        bucket, key = self._object(probe)
        self._s3("written", lambda client: client.delete_object(Bucket=bucket, Key=key))

    def _object(self, location: str) -> tuple[str, str]:
        bucket, _, key = location[len(s3a.SCHEME) :].partition("/")
        return bucket, key

    def _s3(self, done: str, call: Any) -> Any:
        """`call` on a client of the deployment's object store; its failure as StoreUnusable naming the
        place. No checksum is sent unless the request needs one: versitygw misreads the SDK's default."""
        assert self.s3 is not None  # `of` refuses an s3a:// base without an object store
        client = boto3.client(
            "s3",
            endpoint_url=self.s3.endpoint,
            region_name=s3a.region(self.s3),
            verify=str(self.ca) if self.ca is not None else None,
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        try:
            return call(client)
        except (BotoCoreError, ClientError) as error:
            reason = " ".join(str(error).split())
            raise StoreUnusable(
                f"the pipeline's outputs at {shown(self.base)} cannot be {done}: {reason[:300]}"
            ) from None

    def spark_settings(self) -> dict[str, str]:
        """What Spark needs to write and read under `base`: nothing for a directory."""
        if not s3a.is_s3a(self.base) or self.s3 is None:
            return {}
        return s3a.spark_settings(self.base, self.s3, self.ca)
