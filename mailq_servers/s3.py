"""An S3 endpoint: versitygw v1.8.0 over its posix backend, built from its Go module into the cache.

It checks signatures and checksums and keeps its data across restarts, as a real S3 does (moto's server
does neither); its two known departures from S3 (`//` in keys, a key that is also another key's folder)
never arise with mailq's flat keys."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import LOOPBACK, Place, Proc, Server, fresh_log, require_program, run_logged, say, spawn, wait_for

if TYPE_CHECKING:
    from botocore.client import BaseClient

VERSION = "v1.8.0"
MODULE = "github.com/versity/versitygw/cmd/versitygw"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """How to reach the endpoint: boto3 with `endpoint_url`, these keys and region."""

    endpoint_url: str
    access_key_id: str
    # Kept out of repr, so test reports and logs never show it.
    secret_access_key: str = field(repr=False)
    region: str = REGION
    ca: str = ""  # the CA file of an https endpoint

    def client(self, **options: Any) -> BaseClient:
        """A boto3 S3 client for this endpoint; options go to `boto3.client`."""
        import boto3

        if self.ca:
            options.setdefault("verify", self.ca)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
            **options,
        )

    def env(self) -> dict[str, str]:
        if self.ca:
            # A shell takes one S3 endpoint's variables: the plaintext one's; this one's URL and CA only.
            return {"MAILQ_S3_TLS_ENDPOINT": self.endpoint_url, "MAILQ_TLS_CA": self.ca}
        return {
            "MAILQ_S3_ENDPOINT": self.endpoint_url,
            # boto3 reads this one itself (botocore >= 1.31), so any client in that shell finds the endpoint.
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            **self.keys_env(),
        }

    def keys_env(self) -> dict[str, str]:
        """The keys and region, as the AWS SDKs read them: what a process of a deployment on this
        endpoint needs beside its URL."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": self.region,
        }


class S3Endpoint(Server):
    name = "s3"
    port_settings = {"http": ("MAILQ_S3_PORT", 17070)}
    scheme = "http"

    def __init__(
        self, cache: Path | None = None, *, place: Place = LOOPBACK, run_dir: Path | None = None
    ) -> None:
        """The endpoint on this machine's loopback by default; the bed's at its place, data in run_dir."""
        super().__init__(cache, run_dir=run_dir)
        self.place = place
        self.binary = self.home / VERSION / "bin" / "versitygw"
        self.gopath = self.home / "go"
        self.log = self.run_dir / "versitygw.log"
        self.credentials = self.home / "credentials.json"

    def installed(self) -> bool:
        return (self.binary.parent / ".complete").exists()

    def install(self) -> None:
        go = require_program(
            "go", "install Go 1.21 or later (https://go.dev/dl); an older one than 1.25 fetches 1.25 itself"
        )
        say(f"s3: building versitygw {VERSION} with `go install` into {self.binary.parent} (about 4 minutes)")
        staging = self.home / "build-bin"
        shutil.rmtree(staging, ignore_errors=True)
        env = {
            **os.environ,
            "GOBIN": str(staging),
            "GOPATH": str(self.gopath),
            "GOMODCACHE": str(self.gopath / "pkg" / "mod"),
            "GOCACHE": str(self.gopath / "build-cache"),
            # A writable module cache, so that removing the harness's cache needs no chmod first.
            "GOFLAGS": "-modcacherw",
        }
        run_logged(
            [go, "install", f"{MODULE}@{VERSION}"],
            log=self.home / "install.log",
            what=f"building versitygw {VERSION}",
            env=env,
        )
        (staging / ".complete").touch()
        shutil.rmtree(self.binary.parent, ignore_errors=True)
        self.binary.parent.parent.mkdir(parents=True, exist_ok=True)
        staging.replace(self.binary.parent)

    def launch(self) -> dict[str, Proc]:
        data = self.run_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        keys = self._keys()
        env = {
            **os.environ,
            "ROOT_ACCESS_KEY": keys["access_key_id"],
            "ROOT_SECRET_KEY": keys["secret_access_key"],
        }
        argv = [
            str(self.binary),
            "--port",
            f"{self.place.address}:{self.ports()['http']}",
            "--region",
            REGION,
            # Without it boto3's pooled connections are closed after each request and retried.
            "--keep-alive",
            "--quiet",
            *self.tls_arguments(),
            "posix",
            str(data),
        ]
        return {"server": spawn(self.place.command(argv), env=env, log=fresh_log(self.log), cwd=self.run_dir)}

    def tls_arguments(self) -> list[str]:
        """versitygw's options for its certificate; none for plain http."""
        return []

    def url_context(self) -> ssl.SSLContext | None:
        """How to check the endpoint's certificate; None for plain http."""
        return None

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        url = self._endpoint()
        context = self.url_context()

        def answers() -> bool:
            try:
                urllib.request.urlopen(url, timeout=2, context=context).close()
            except urllib.error.HTTPError:
                return True  # an S3 error document (access denied) is an answer
            except OSError:
                return False
            return True

        wait_for("s3", answers, alive=procs["server"].alive, logs=[self.log])

    def facts(self) -> dict:
        keys = self._keys()
        return asdict(S3Server(self._endpoint(), keys["access_key_id"], keys["secret_access_key"], REGION))

    def _endpoint(self) -> str:
        return f"{self.scheme}://{self.place.address}:{self.ports()['http']}"

    def _keys(self) -> dict[str, str]:
        """The root keys, chosen once per cache and kept (owner-readable only) so data stays reachable."""
        try:
            return json.loads(self.credentials.read_text())
        except FileNotFoundError:
            pass
        keys = {
            "access_key_id": f"mailq{secrets.token_hex(8)}",
            "secret_access_key": secrets.token_urlsafe(30),
        }
        self.credentials.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.credentials, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(keys, out)
        return keys


def remove_bucket(client: BaseClient, name: str) -> None:
    """Empty and remove bucket `name`, if it exists."""
    try:
        for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
            client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": entry["Key"]} for entry in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)
    except client.exceptions.NoSuchBucket:
        pass  # never created
