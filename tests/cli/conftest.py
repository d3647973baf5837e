"""The `mailq` command's fixtures: a temporary embedded store's URL, a message file, and the command run
in-process on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mailq_cli.main import main

MESSAGE = (
    b"From: Alice <alice@example.com>\r\nTo: bob@example.org\r\nSubject: Lunch\r\n"
    b"Message-ID: <1@example.com>\r\n\r\nTomorrow at noon?\r\n"
)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"embedded://{tmp_path / 'data'}"


@pytest.fixture
def eml(tmp_path: Path) -> Path:
    path = tmp_path / "lunch.eml"
    path.write_bytes(MESSAGE)
    return path


@pytest.fixture
def mailq(url: str, capsys: pytest.CaptureFixture[str]):
    """Run `mailq --url <tmp> ...`; returns (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        status = main(["--url", url, *args])
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run


@pytest.fixture
def mailq_json(mailq):
    """Run `mailq --url <tmp> --json ...`, check it succeeded, and parse its one JSON document."""

    def run(*args: str):
        status, out, err = mailq("--json", *args)
        assert (status, err) == (0, "")
        return json.loads(out)

    return run
