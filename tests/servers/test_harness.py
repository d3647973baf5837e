"""The harness's own guarantees: what it calls alive and ours, what it refuses, what `env` prints."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .base import Proc, ServerError
from .s3 import S3Endpoint, S3Server

REPO = Path(__file__).resolve().parents[2]


def test_a_zombie_is_not_alive():
    child = subprocess.Popen(["sleep", "0.2"])
    proc = Proc.of(child.pid)
    assert proc.alive()
    deadline = time.monotonic() + 10
    while " Z " not in Path(f"/proc/{child.pid}/stat").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    # Exited but not yet reaped: it still has a pid and answers kill -0.
    os.kill(child.pid, 0)
    assert not proc.alive()
    child.wait()


def test_a_port_held_by_another_process_is_refused_with_the_variable_to_change(tmp_path, monkeypatch):
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        monkeypatch.setenv("MAILQ_S3_PORT", str(port))
        with pytest.raises(ServerError, match=f"port {port} .*MAILQ_S3_PORT=PORT"):
            S3Endpoint(cache=tmp_path).ensure()
        assert Proc.of(os.getpid()).owns_listener(port)
    assert not (tmp_path / "s3" / "run" / "state.json").exists()


def test_a_running_server_is_reused_and_holds_its_port(s3_server: S3Server):
    started = time.monotonic()
    running, did = S3Endpoint().ensure()
    assert did == "reused"
    assert time.monotonic() - started < 2
    assert running.procs["server"].owns_listener(running.ports["http"])
    assert not Proc.of(os.getpid()).owns_listener(running.ports["http"])


def test_env_prints_lines_a_shell_can_source(s3_server: S3Server):
    shell = subprocess.run(
        [
            "/bin/sh",
            "-c",
            f'eval "$("{sys.executable}" -m tests.servers env s3)" && echo "$AWS_ENDPOINT_URL_S3"',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout.strip() == s3_server.endpoint_url
