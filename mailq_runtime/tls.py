"""The TLS of a distributed deployment's links (Cassandra, S3 over https, RabbitMQ over amqps): the PEM files
the URL names (`TlsFiles`), the client context made of them, and one line for a handshake that failed.

The files are named by absolute path and read by the process that connects (a Spark executor too), so
the settings hold no key, only where it is. The context verifies the server's certificate against `ca`
(the system's CAs without it) and that it names the host the client connected to: an address for
Cassandra, whose driver connects to each node by the address the cluster gives. `cert` and `key`, a
client certificate, are presented to a server that asks for one (mutual TLS)."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidInput, shown

# OpenSSL's reasons for a handshake the server ended, as "[SSL: <CODE>] <text>" in an SSLError.
_ALERT = re.compile(r"\[SSL: ([A-Z0-9_]+)\] ([^(]*)")
_VERIFY_FAILED = "certificate verify failed: "
_URLLIB3_MISMATCH = re.compile(r"hostname ('[^']*') doesn't match")
_PLAINTEXT_PEER = (
    "WRONG_VERSION_NUMBER",
    "HTTP_REQUEST",
    "RECORD_LAYER_FAILURE",
)


@dataclass(frozen=True)
class TlsFiles:
    """The CA file verifying servers (None: the system's CAs) and a client certificate and its key (both
    or neither)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def context(self) -> ssl.SSLContext:
        """A client context on these files; InvalidInput naming the file that cannot be used."""
        # The CA given replaces the system's, as boto3's `verify` does for S3: one rule for every link.
        try:
            context = ssl.create_default_context(cafile=None if self.ca is None else str(self.ca))
        except (OSError, ssl.SSLError) as error:
            raise InvalidInput(f"cannot use the CA file ca={shown(str(self.ca))}: {_why(error)}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None and self.key is not None:
            try:
                context.load_cert_chain(str(self.cert), str(self.key))
            except (OSError, ssl.SSLError) as error:
                raise InvalidInput(
                    f"cannot use the client certificate cert={shown(str(self.cert))} with "
                    f"key={shown(str(self.key))}: {_why(error)}"
                ) from None
        return context


def tls_files(
    options: Mapping[str, str], *, cassandra_tls: bool, s3_endpoint: str | None, broker_tls: bool | None
) -> TlsFiles:
    """The files of a URL's `ca`, `cert` and `key` options, once checked that `tls=on` (`cassandra_tls`)
    leaves no link in the clear and that the files serve a link that speaks TLS. `broker_tls` is None for
    the embedded broker, which is no link."""
    s3_tls = s3_endpoint is None or s3_endpoint.startswith("https://")
    if cassandra_tls:
        if not s3_tls:
            raise InvalidInput(
                f"tls=on encrypts every link, but the s3_endpoint {shown(s3_endpoint)} is http://: "
                "use https://"
            )
        if broker_tls is False:
            raise InvalidInput("tls=on encrypts every link, but the broker is amqp://: use amqps://")
    files = {name: _absolute(options[name], name) for name in ("ca", "cert", "key") if name in options}
    if ("cert" in files) != ("key" in files):
        raise InvalidInput("give both a client certificate (cert=) and its key (key=), or neither")
    if files and not (cassandra_tls or s3_tls or broker_tls):
        raise InvalidInput(
            f"the options {', '.join(sorted(files))} name TLS files, but no link speaks TLS: "
            "tls=on for Cassandra, an https:// s3_endpoint, an amqps:// broker"
        )
    return TlsFiles(**files)


def _absolute(value: str, option: str) -> Path:
    """The path of a URL's file option: absolute, as every process that connects reads it where it runs."""
    path = Path(value)
    if not path.is_absolute():
        raise InvalidInput(
            f"invalid {option} {shown(value)}: expected an absolute path (every process that connects, "
            "a Spark executor too, reads the file at that path)"
        )
    return path


def tls_failure(error: BaseException | None) -> str | None:
    """One line for the TLS failure in `error`, its causes or the errors it groups (a driver's "no host
    available"), or None when there is none."""
    found = _ssl_error(error)
    if found is None:
        mismatch = _URLLIB3_MISMATCH.search(str(error))
        if mismatch is None:
            return None
        # urllib3 matches an address itself, raising its own error, which botocore passes on as text.
        return _verify_failure(f"Hostname mismatch, certificate is not valid for {mismatch.group(1)}")
    if isinstance(found, ssl.SSLCertVerificationError):
        return _verify_failure(found.verify_message or str(found))
    text = str(found)
    if _VERIFY_FAILED in text:  # a driver that passes the verification's failure on as a plain SSLError
        return _verify_failure(text.split(_VERIFY_FAILED, 1)[1].split(" (_ssl.c")[0])
    return _handshake_failure(found)


def certificate_refused(error: BaseException | None) -> bool:
    """Whether `error` holds a certificate that failed verification, on either side: a lasting failure,
    which waiting does not cure (unlike a handshake cut short by a server going down)."""
    found = _ssl_error(error)
    if found is None:
        return False
    return (
        isinstance(found, ssl.SSLCertVerificationError)
        or _VERIFY_FAILED in str(found)
        or "ALERT" in _code(found)
    )


def _ssl_error(error: BaseException | None) -> ssl.SSLError | None:
    """The ssl module's error in `error`'s chain; else one remade from the OpenSSL reason its text quotes
    (pika passes a lost handshake on as text only)."""
    seen: set[int] = set()
    pending = [error]
    quoted = None
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return current
        quoted = quoted or _ALERT.search(str(current))
        pending += [current.__cause__, current.__context__]
        pending += [one for one in current.args if isinstance(one, BaseException)]
        # botocore's errors keep their cause among their keyword arguments.
        keywords = getattr(current, "kwargs", None)
        if isinstance(keywords, dict):
            pending += [one for one in keywords.values() if isinstance(one, BaseException)]
        grouped = getattr(current, "errors", None)
        if isinstance(grouped, dict):
            pending += [one for one in grouped.values() if isinstance(one, BaseException)]
        elif isinstance(grouped, list | tuple):
            pending += [one for one in grouped if isinstance(one, BaseException)]
        # pika's connection workflow keeps each attempt's error in `exceptions`.
        pending += [one for one in getattr(current, "exceptions", ()) or () if isinstance(one, BaseException)]
    return None if quoted is None else ssl.SSLError(1, quoted.group(0))


def _code(error: ssl.SSLError) -> str:
    found = _ALERT.search(str(error))
    return found.group(1) if found else (getattr(error, "reason", None) or "")


def _verify_failure(reason: str) -> str:
    reason = reason.strip().rstrip(".")
    lowered = reason.lower()
    hint = ""
    if (
        "issuer" in lowered
        or "self-signed" in lowered
        or "self signed" in lowered
        or "first certificate" in lowered
    ):
        hint = ": it is not signed by the CA given (ca=), or no CA was given"
    elif "expired" in lowered:
        hint = ": the server's certificate is past its date, renew it"
    elif "not yet valid" in lowered:
        hint = ": the server's certificate is not valid yet (check the clocks)"
    elif "mismatch" in lowered:
        hint = ": the server's certificate does not name the host connected to"
    return f"TLS: the server's certificate failed verification ({reason}){hint}"


def _handshake_failure(error: ssl.SSLError) -> str:
    found = _ALERT.search(str(error))
    code = _code(error)
    text = found.group(2).strip() if found else str(error)
    if code in _PLAINTEXT_PEER:
        return f"TLS: the handshake failed ({text or code}): does the server speak TLS on this port?"
    if isinstance(error, ssl.SSLEOFError) or "EOF" in code:
        return (
            "TLS: the server closed the connection during the handshake: does it speak TLS on this port, "
            "does it want a client certificate (cert=, key=) that it accepts?"
        )
    if code.endswith("CERTIFICATE_REQUIRED"):
        return "TLS: the server requires a client certificate (cert= and key=)"
    if "ALERT" in code:
        return f"TLS: the server refused the handshake ({text}): check the client certificate (cert=, key=)"
    return f"TLS: the handshake failed ({text or code})"


def _why(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return " ".join(str(error).split())
