"""Where the pipeline's outputs are: a directory of this machine (the embedded deployment's), or an
`s3a://` location in the deployment's object store, which a Spark cluster's driver and workers reach
without sharing a disk. Spark writes and reads them through Hadoop (s3a.py); the rest of the pipeline and
the command line list the records and get their Parquet parts with boto3 (pyarrow's own S3 file system can
crash its process at exit when one outlives the interpreter), reaching the object store as the deployment
does, and read the parts with pyarrow."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
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

    def is_file(self, location: str) -> bool:
        if not s3a.is_s3a(location):
            return os.path.isfile(location)
        bucket, key = self._object(location)
        return any(
            item["Key"] == key for page in self._listed(bucket, key) for item in page.get("Contents", ())
        )

    def directories(self, location: str) -> list[str]:
        """The names of the directories (common prefixes) right under `location`."""
        if not s3a.is_s3a(location):
            if not os.path.isdir(location):
                return []
            return [entry.name for entry in os.scandir(location) if entry.is_dir()]
        bucket, prefix = self._object(location.rstrip("/") + "/")
        pages = self._listed(bucket, prefix, delimiter="/")
        return [
            item["Prefix"][len(prefix) :].rstrip("/")
            for page in pages
            for item in page.get("CommonPrefixes", ())
        ]

    def parquet(
        self, location: str, columns: list[str] | None = None, where: ds.Expression | None = None
    ) -> pa.Table | None:
        """The rows of the Parquet parts right under `location` (those of `columns`, matching `where`);
        None when it holds no part file, as Spark may leave an empty output. Files named `_*` or `.*` are
        Spark's markers, not parts."""
        if not s3a.is_s3a(location):
            dataset = ds.dataset(location, format="parquet")
            return dataset.to_table(columns=columns, filter=where) if dataset.files else None
        bucket, prefix = self._object(location.rstrip("/") + "/")
        pages = self._listed(bucket, prefix, delimiter="/")
        names = sorted(item["Key"][len(prefix) :] for page in pages for item in page.get("Contents", ()))
        parts = [
            pq.read_table(
                io.BytesIO(self.read(f"{location.rstrip('/')}/{name}")), columns=columns, filters=where
            )
            for name in names
            if not name.startswith(("_", "."))
        ]
        return pa.concat_tables(parts) if parts else None

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

    def _listed(self, bucket: str, prefix: str, delimiter: str = "") -> list[dict]:
        """The pages of a listing of `bucket` under `prefix`."""
        return self._s3(
            "listed",
            lambda client: list(
                client.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=prefix, Delimiter=delimiter
                )
            ),
        )

    def _object(self, location: str) -> tuple[str, str]:
        bucket, _, key = location[len(s3a.SCHEME) :].partition("/")
        return bucket, key

    def _s3(self, done: str, call: Callable[[Any], Any]) -> Any:
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
