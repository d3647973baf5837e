"""The system packages: one list, installed in one apt-get step before the tests, and nothing of the suite or
the harness's start path installing anything (two pytest workers running apt-get at once failed a fresh
machine's CI on apt's lock)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from mailq_servers.base import ServerError
from mailq_servers.prometheus import Prometheus
from mailq_servers.rabbitmq import RabbitMQ
from mailq_servers.system_packages import INSTALL_COMMAND, INSTALLER, LIST, package_of, system_program

REPO = Path(__file__).resolve().parents[2]
# The code that runs under pytest or starts a server: none of it may name a package manager.
SCANNED = ("tests", "mailq_servers", "mailq_runtime", "mailq_cli", "benchmarks")
PACKAGE_MANAGERS = frozenset({"apt", "apt-get", "aptitude", "dpkg", "debconf-set-selections"})
HARNESS_LOOKUPS = frozenset({"system_program", "missing_program", "package_of"})


def python_files() -> list[Path]:
    """The scanned modules, less this one, which makes stand-ins of the package tools."""
    here = Path(__file__).resolve()
    return sorted(path for top in SCANNED for path in (REPO / top).rglob("*.py") if path.resolve() != here)


def test_no_module_of_the_suite_or_the_harness_runs_a_package_manager():
    offenders = []
    for path in python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in PACKAGE_MANAGERS:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.Name | ast.Attribute) and "apt_install" in ast.unparse(node):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} apt_install")
    assert offenders == []


def test_every_program_the_harness_looks_for_has_its_package_in_the_list():
    looked_for = set()
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in HARNESS_LOOKUPS
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                looked_for.add(node.args[0].value)
    assert {"swaks", "smtp-source", "smtp-sink", "postfix", "dnsmasq", "prometheus", "rabbitmq-server"} <= (
        looked_for
    )
    assert {program: package_of(program).name for program in looked_for}["smtp-sink"] == "postfix"


@pytest.fixture
def fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH of stand-ins for the package tools, each recording its arguments, and nothing else: what the
    code under test runs of apt is in the returned file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    record_calls(bin_dir, calls, PACKAGE_MANAGERS)
    monkeypatch.setenv("PATH", str(bin_dir))
    return calls


def record_calls(bin_dir: Path, calls: Path, tools: frozenset[str]) -> None:
    for tool in tools:
        stand_in = bin_dir / tool
        stand_in.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\ncat >/dev/null\n')
        stand_in.chmod(0o755)


def test_a_missing_program_names_its_package_and_the_install_command_and_installs_nothing(fake_apt: Path):
    with pytest.raises(ServerError) as refused:
        system_program("swaks")
    assert "Debian's swaks is not installed" in str(refused.value)
    assert INSTALL_COMMAND in str(refused.value)
    assert not fake_apt.exists()


@pytest.mark.parametrize(("server", "package"), [(RabbitMQ, "rabbitmq-server"), (Prometheus, "prometheus")])
def test_a_server_of_a_debian_package_that_is_missing_fails_to_start_without_installing(
    server, package: str, fake_apt: Path, tmp_path: Path
):
    with pytest.raises(ServerError, match=f"Debian's {package} is not installed"):
        server(cache=tmp_path / "cache").install()
    assert not fake_apt.exists()


def installer_with(tmp_path: Path, packages: list[str]) -> Path:
    """The project's installer beside a list of the given packages."""
    home = tmp_path / "installer"
    home.mkdir(parents=True)
    shutil.copy(INSTALLER, home / INSTALLER.name)
    lines = [line for line in LIST.read_text().splitlines() if line.startswith("#")]
    (home / LIST.name).write_text("\n".join([*lines, *(f"{name}  -  a test's package" for name in packages)]))
    return home / INSTALLER.name


def installed(package: str) -> bool:
    query = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return query.stdout == "install ok installed"


def run_installer(installer: Path, env: dict[str, str], user: list[str] | None = None):
    return subprocess.run(
        [*(user or []), "bash", str(installer)], capture_output=True, text=True, env=env, timeout=60
    )


def test_the_installer_installs_every_missing_package_in_one_apt_get_step_and_nothing_when_none_is(
    tmp_path: Path,
):
    assert installed("openssl")
    absent = ["mailq-no-such-package-a", "mailq-no-such-package-b"]
    # The stand-ins record the calls; dpkg-query stays the real one, so the installed state is the machine's.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    record_calls(bin_dir, calls, PACKAGE_MANAGERS - {"dpkg"})
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    nothing_missing = run_installer(installer_with(tmp_path / "one", ["openssl"]), env)
    assert (nothing_missing.returncode, nothing_missing.stdout, calls.exists()) == (0, "", False)

    if os.geteuid() == 0:
        policy = Path("/usr/sbin/policy-rc.d")
        policy_before = policy.read_text() if policy.exists() else None
        some_missing = run_installer(installer_with(tmp_path / "two", ["openssl", *absent]), env)
        assert some_missing.returncode == 0, some_missing.stderr
        installs = [line for line in calls.read_text().splitlines() if " install " in f" {line} "]
        assert installs == [f"apt-get install -y --no-install-recommends {' '.join(absent)} -qq"]
        assert "debconf-set-selections" in calls.read_text()
        assert (policy.read_text() if policy.exists() else None) == policy_before


def test_the_installer_run_without_root_prints_the_command_and_fails():
    if os.geteuid() != 0:
        user: list[str] = []
    else:
        setpriv = shutil.which("setpriv")
        assert setpriv is not None, "setpriv (util-linux) not found"
        user = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    # Where the user nobody can read the installer (the suite's own temporary directory is its owner's).
    with tempfile.TemporaryDirectory() as shared:
        Path(shared).chmod(0o755)
        installer = installer_with(Path(shared), ["mailq-no-such-package"])
        refused = run_installer(installer, dict(os.environ), user)
    assert refused.returncode == 1
    assert "sudo make system-packages" in refused.stderr
    assert "apt-get install -y --no-install-recommends mailq-no-such-package" in refused.stderr
