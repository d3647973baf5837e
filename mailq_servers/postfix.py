"""A private Postfix as a remote mail exchanger for remote delivery's tests: Debian's Postfix (installed
with debconf's "No configuration", so no system instance runs), with its own configuration and queue
directories in a temporary directory, smtpd on a loopback port, delivering the mail of one domain's
users to their Maildirs and refusing unknown users at RCPT (550 5.1.1), as a real MX does.

Started per test by the fixtures that need it (tests/relay/), as the DNS server and smtp-sink."""

from __future__ import annotations

import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .base import HOST, ServerError, port_answers, wait_for
from .system_packages import system_program

_MAIN = """compatibility_level = 3.6
queue_directory = {root}/queue
data_directory = {root}/data
command_directory = /usr/sbin
daemon_directory = /usr/lib/postfix/sbin
meta_directory = /etc/postfix
shlib_directory = /usr/lib/postfix
mail_owner = postfix
setgid_group = postdrop
inet_interfaces = {host}
inet_protocols = ipv4
myhostname = {hostname}
mydestination =
mynetworks = 127.0.0.0/8
virtual_mailbox_domains = {domain}
virtual_mailbox_base = {root}/mail
virtual_mailbox_maps = inline:{{ {mailboxes} }}
virtual_uid_maps = static:{uid}
virtual_gid_maps = static:{gid}
maillog_file = {root}/maillog
maillog_file_prefixes = {root}
smtpd_recipient_restrictions = permit_mynetworks, reject_unauth_destination
"""


class PrivatePostfix:
    """Postfix on `host`:`port` taking mail for `users` (addresses of one domain) into their Maildirs,
    offering STARTTLS with `tls` (a PEM certificate and key) if given, relaying the mail of the domains
    `transport` names to their (host, port) (Postfix's transport_maps), as a relay for loopback clients
    does. A context manager;
    `delivered(address)` reads the mails in that user's Maildir, `sessions()` lists the sessions that
    ended."""

    def __init__(
        self,
        port: int,
        users: Sequence[str],
        *,
        host: str = HOST,
        tls: tuple[Path, Path] | None = None,
        process_limit: int | None = None,
        transport: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        domains = {user.rpartition("@")[2] for user in users}
        if len(domains) != 1:
            raise ServerError(f"a private Postfix serves the users of one domain, not {sorted(domains)}")
        self.port = port
        self.host = host
        self.users = tuple(users)
        self.domain = domains.pop()
        self.tls = tls
        self.process_limit = process_limit  # Postfix's default_process_limit, 100 unless given
        self.transport = dict(transport or {})
        self.root: Path | None = None

    def __enter__(self) -> PrivatePostfix:
        postfix = system_program("postfix")
        self.root = Path(tempfile.mkdtemp(prefix="mailq-postfix-"))
        self.root.chmod(0o755)  # Postfix's processes, as the user postfix, reach their queue through it
        config = self._configure(self.root)
        subprocess.run([postfix, "-c", str(config), "start"], check=True, capture_output=True)
        wait_for(
            "postfix",
            lambda: port_answers(self.port, self.host),
            alive=lambda: True,
            logs=[self.root / "maillog"],
            timeout=30,
        )
        return self

    def __exit__(self, *exception: object) -> None:
        if self.root is not None:
            subprocess.run(
                ["postfix", "-c", str(self.root / "etc"), "stop"], check=False, capture_output=True
            )
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def maildir(self, user: str) -> Path:
        """Where `user`'s delivered mails appear (the Maildir's new/), made at the first."""
        assert self.root is not None, "the private Postfix is not running"
        return self.root / "mail" / _mailbox(user) / "new"

    def delivered(self, user: str) -> list[bytes]:
        """The mails in `user`'s Maildir (new/), oldest first."""
        new = self.maildir(user)
        if not new.exists():
            return []
        return [path.read_bytes() for path in sorted(new.iterdir(), key=lambda p: p.stat().st_mtime)]

    def sessions(self) -> list[str]:
        """The SMTP sessions that ended, as smtpd logs their commands (`ehlo=1 mail=3 ... quit=1`); the
        harness's readiness probe, which sent none, is not one."""
        assert self.root is not None, "the private Postfix is not running"
        log = self.root / "maillog"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        return [
            line.split("]", 2)[-1].strip() for line in lines if "disconnect from" in line and "ehlo=" in line
        ]

    def _configure(self, root: Path) -> Path:
        account = pwd.getpwnam("postfix")
        for directory in ("etc", "queue", "data", "mail"):
            (root / directory).mkdir()
        for directory in ("data", "mail"):
            shutil.chown(root / directory, "postfix", "postfix")
        mailboxes = " ".join(f"{user}={_mailbox(user)}/" for user in self.users)
        options = ""
        if self.tls is not None:
            cert, key = self.tls
            options = f"smtpd_tls_security_level = may\nsmtpd_tls_cert_file = {cert}\n"
            options += f"smtpd_tls_key_file = {key}\n"
        if self.process_limit is not None:
            options += f"default_process_limit = {self.process_limit}\n"
        if self.transport:
            # Brackets: the host itself, no MX look-up (Postfix's transport(5) syntax).
            entries = " ".join(
                f"{domain}=smtp:[{host}]:{port}" for domain, (host, port) in self.transport.items()
            )
            options += f"transport_maps = inline:{{ {entries} }}\n"
        (root / "etc" / "main.cf").write_text(
            options
            + _MAIN.format(
                root=root,
                host=self.host,
                hostname=f"mx.{self.domain}",
                domain=self.domain,
                mailboxes=mailboxes,
                uid=account.pw_uid,
                gid=account.pw_gid,
            )
        )
        (root / "etc" / "master.cf").write_text(_master(self.host, self.port))
        return root / "etc"


def _mailbox(user: str) -> str:
    return user.partition("@")[0]


def _master(host: str, port: int) -> str:
    """Debian's master.cf with smtpd on `host`:`port` instead of port 25, and no chroot (the queue is a
    temporary directory that a chroot would have to hold)."""
    lines = []
    for line in Path("/etc/postfix/master.cf").read_text().splitlines():
        fields = line.split()
        if line[:1] not in ("#", " ", "\t", "") and len(fields) >= 8:
            if fields[0] == "smtp" and fields[1] == "inet":
                fields[0] = f"{host}:{port}"
            fields[4] = "n"
            line = " ".join(fields)
        lines.append(line)
    return "\n".join(lines) + "\n"
