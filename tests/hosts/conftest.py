"""Fixtures of the tests on the host bed: a deployment of each module's own on it, and mailq commands run
on its hosts."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mailq_servers import bed_deployment
from mailq_servers.host_bed import HostBed, running_facts


@pytest.fixture(scope="module")
def bed_url(host_bed: HostBed) -> Iterator[str]:
    """A keyspace, bucket and vhost of this module's own on the bed, removed after its tests."""
    url = bed_deployment.make(host_bed, f"mailq-bed-{int(time.time())}-{secrets.token_hex(3)}")
    yield url
    bed_deployment.remove(host_bed, url)


@pytest.fixture(scope="module")
def bed_env(host_bed: HostBed) -> dict[str, str]:
    """The environment of a mailq process on the bed: this one's, with the bed's password and S3 keys."""
    return {**os.environ, **running_facts().client_env(), "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def bed_client(monkeypatch: pytest.MonkeyPatch, host_bed: HostBed) -> None:
    """This process a client of the bed (a runtime it opens reaches the bed's servers from the root
    namespace), with the bed's password and S3 keys in its environment."""
    for variable, value in running_facts().client_env().items():
        monkeypatch.setenv(variable, value)


def mailq_on(bed: HostBed, host: str, url: str, *argv: str) -> list[str]:
    """The argv of `mailq --url URL ARGV` run on `host` of the bed, with this interpreter."""
    return bed.host(host).command([sys.executable, "-m", "mailq_cli", "--url", url, *argv])


def run_on(bed: HostBed, host: str, url: str, env: dict[str, str], *argv: str) -> str:
    """Run `mailq ARGV` on `host` to its end; its stdout, or a failure with its stderr."""
    done = subprocess.run(
        mailq_on(bed, host, url, *argv), env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"mailq {' '.join(argv)} on {host}: {done.stderr}"
    return done.stdout
