"""The Debian packages mailq's suite, benchmarks and demos need: one list (system-packages.txt), installed
in one apt-get step by install-system-packages (`make system-packages`, `.ci/run`) before any test. The
harness only looks for their programs: a missing one is an error naming its package and the command that
installs the list, never an install of its own (two test processes installing at once fail on apt's lock)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .base import ServerError

LIST = Path(__file__).with_name("system-packages.txt")
INSTALLER = LIST.with_name("install-system-packages")
INSTALL_COMMAND = "sudo make system-packages"


@dataclass(frozen=True)
class SystemPackage:
    name: str
    programs: tuple[str, ...]
    reason: str


@cache
def system_packages() -> tuple[SystemPackage, ...]:
    """The list's packages, in its order."""
    packages = []
    for line in LIST.read_text().splitlines():
        fields = line.split("#", 1)[0].split(maxsplit=2)
        if not fields:
            continue
        name, programs, reason = (fields + ["-", ""])[:3]
        packages.append(SystemPackage(name, () if programs == "-" else tuple(programs.split(",")), reason))
    return tuple(packages)


def package_of(program: str) -> SystemPackage:
    for package in system_packages():
        if program in package.programs:
            return package
    raise ValueError(f"{program} is not a program of {LIST.name}: add its package there")


def missing_program(program: str) -> ServerError:
    """The error for a program of the list that the machine lacks."""
    package = package_of(program)
    return ServerError(
        f"{program} not found: Debian's {package.name} is not installed ({package.reason}); "
        f"install mailq's system packages first: {INSTALL_COMMAND}"
    )


def system_program(program: str) -> str:
    """The path of `program`, one of the list's, or the error naming its package."""
    found = shutil.which(program)
    if found is None:
        raise missing_program(program)
    return found
