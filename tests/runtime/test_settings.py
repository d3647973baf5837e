"""The one URL parser: both deployments' grammar into Settings and back, its refusals, and secrets that no
Settings, URL or message ever holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailq_runtime import InvalidInput
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.settings import (
    AmqpSettings,
    CassandraSettings,
    S3Settings,
    Settings,
    redact,
)
from mailq_runtime.tls import TlsFiles

DISTRIBUTED = (
    "cassandra://mailq@db1,db2:9043,[::1]:9044/mail_queue?s3=mail-blobs&s3_endpoint=http://127.0.0.1:7070"
    "&s3_region=eu-west-3&s3_prefix=prod/blobs&broker=amqp://rabbit@mq:5673/prod"
    "&consistency=quorum&replication=3&visibility_timeout=10m&bucket_count=4"
)
EMBEDDED_BROKER = "cassandra://db1/mailq?s3=mail-blobs&broker=embedded:/var/lib/mailq"
TLS = (
    "cassandra://db1,db2/mail?tls=on&ca=/etc/mailq/ca.pem&cert=/etc/mailq/c.pem&key=/etc/mailq/k.pem"
    "&s3=mail-blobs&s3_endpoint=https://s3.internal:9000&broker=amqps://mailq@mq1,mq2/mail"
)


def test_the_distributed_url_parses_into_its_parts():
    settings = Settings.from_url(DISTRIBUTED)
    assert settings.backend == "cassandra"
    assert settings.cassandra == CassandraSettings(
        contact_points=(("db1", 9042), ("db2", 9043), ("::1", 9044)),
        keyspace="mail_queue",
        user="mailq",
        consistency="QUORUM",
        replication=3,
    )
    assert settings.s3 == S3Settings(
        bucket="mail-blobs", endpoint="http://127.0.0.1:7070", region="eu-west-3", prefix="prod/blobs"
    )
    assert settings.amqp == AmqpSettings(host="mq", port=5673, vhost="prod", user="rabbit")
    assert settings.data_dir is None
    assert settings.visibility_timeout == 600 * MICROS_PER_SECOND
    assert settings.view_configuration == {"bucket_count": 4}


def test_defaults_of_the_distributed_url_and_its_embedded_broker():
    settings = Settings.from_url(EMBEDDED_BROKER)
    assert settings.cassandra == CassandraSettings(contact_points=(("db1", 9042),), keyspace="mailq")
    assert settings.cassandra.consistency == "LOCAL_QUORUM" and settings.cassandra.replication == 1
    assert settings.s3 == S3Settings(bucket="mail-blobs")
    assert (settings.amqp, settings.data_dir) == (None, Path("/var/lib/mailq"))
    assert Settings.from_url("cassandra://db/ks?s3=abc&broker=amqp://mq").amqp == AmqpSettings(
        "mq", 5672, "/"
    )


@pytest.mark.parametrize(
    "url",
    [
        "embedded://.mailq",
        "embedded:///var/lib/mailq?durability=fsync&slice_window=30m&bucket_count=4&max_message_size=1000",
        "embedded://relative/dir?visibility_timeout=1.5s&clock_skew_grace=0s&update_browse_start_pace=7",
        DISTRIBUTED,
        EMBEDDED_BROKER,
        "cassandra://db/ks?s3=abc&broker=amqp://mq/a%2Fb-c",
        TLS,
        "cassandra://db/ks?s3=abc&s3_endpoint=https://s3&ca=/ca.pem&broker=embedded:/b",
    ],
)
def test_settings_make_the_url_they_are_read_from(url):
    settings = Settings.from_url(url)
    assert Settings.from_url(settings.to_url()) == settings
    absolute = settings.absolute()
    assert Settings.from_url(absolute.url) == absolute
    assert absolute.data_dir is None or absolute.data_dir.is_absolute()


REFUSED = {
    "no-keyspace": ("cassandra://db1", "names no keyspace"),
    "keyspace-case": ("cassandra://db1/MailQ?s3=abc&broker=amqp://mq", "invalid keyspace 'MailQ'"),
    "no-host": ("cassandra:///ks?s3=abc&broker=amqp://mq", "names no host"),
    "bad-host": ("cassandra://db_1/ks?s3=abc&broker=amqp://mq", "invalid Cassandra host 'db_1'"),
    "port-zero": ("cassandra://db:0/ks?s3=abc&broker=amqp://mq", "invalid Cassandra host port '0'"),
    "port-huge": ("cassandra://db:70000/ks?s3=abc&broker=amqp://mq", "port number from 1 to 65535"),
    "no-s3": ("cassandra://db/ks?broker=amqp://mq", "needs the option s3=<bucket>"),
    "no-broker": ("cassandra://db/ks?s3=abc", "needs the option broker="),
    "bad-bucket": ("cassandra://db/ks?s3=Bad_Bucket&broker=amqp://mq", "invalid s3 bucket 'Bad_Bucket'"),
    "bad-prefix": ("cassandra://db/ks?s3=abc&s3_prefix=a//b&broker=amqp://mq", "invalid s3_prefix"),
    "bad-endpoint": ("cassandra://db/ks?s3=abc&s3_endpoint=ftp://x&broker=amqp://mq", "invalid s3_endpoint"),
    "bad-broker": ("cassandra://db/ks?s3=abc&broker=redis://mq", "invalid broker"),
    "serial": (
        "cassandra://db/ks?s3=abc&broker=amqp://mq&consistency=serial",
        "invalid consistency 'serial'",
    ),
    "replication": ("cassandra://db/ks?s3=abc&broker=amqp://mq&replication=0", "invalid replication"),
    "twice": ("embedded:///d?durability=fsync&durability=power", "option durability is given twice"),
    "empty": ("embedded:///d?durability=", "option durability has no value"),
    "s3-on-embedded": ("embedded:///d?s3=abc", "unknown mailq URL option(s) 's3' for embedded://"),
    "fragment": ("embedded:///d#x", "has no '#' fragment"),
    "scheme": ("redis://host/0", "unsupported mailq URL scheme 'redis'"),
    "tls-http-s3": (
        "cassandra://db/ks?tls=on&s3=abc&s3_endpoint=http://s3&broker=embedded:/b",
        "tls=on encrypts every link, but the s3_endpoint 'http://s3' is http://",
    ),
    "tls-amqp": ("cassandra://db/ks?tls=on&s3=abc&broker=amqp://mq", "but the broker is amqp://"),
    "tls-value": ("cassandra://db/ks?tls=yes&s3=abc&broker=amqps://mq", "invalid tls 'yes'"),
    "relative-ca": (
        "cassandra://db/ks?tls=on&ca=ca.pem&s3=abc&broker=amqps://mq",
        "expected an absolute path",
    ),
    "cert-no-key": ("cassandra://db/ks?tls=on&cert=/c.pem&s3=abc&broker=amqps://mq", "and its key (key=)"),
    "files-no-tls": (
        "cassandra://db/ks?ca=/ca.pem&s3=abc&s3_endpoint=http://s3&broker=amqp://mq",
        "name TLS files, but no link speaks TLS",
    ),
}


def test_tls_on_every_link_and_the_files_that_serve_it():
    settings = Settings.from_url(TLS)
    assert settings.cassandra.tls and settings.amqp.tls
    assert settings.amqp.hosts == (("mq1", 5671), ("mq2", 5671))  # amqps' port
    assert settings.tls_files == TlsFiles(
        Path("/etc/mailq/ca.pem"), Path("/etc/mailq/c.pem"), Path("/etc/mailq/k.pem")
    )
    plain = Settings.from_url(EMBEDDED_BROKER)
    assert not plain.cassandra.tls and plain.tls_files == TlsFiles()


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_bad_url_is_one_clear_error(case):
    url, message = REFUSED[case]
    with pytest.raises(InvalidInput) as refused:
        Settings.from_url(url)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "cassandra://mailq:secret@db/ks?s3=abc&broker=amqp://mq",
        "cassandra://db/ks?s3=abc&broker=amqp://rabbit:secret@mq/prod",
        "cassandra://db/ks?s3=abc&broker=amqp%3A%2F%2Frabbit%3Asecret%40mq%2Fprod",
        "cassandra://db/ks?s3=abc&s3_endpoint=http://key:secret@minio:9000&broker=amqp://mq",
    ],
)
def test_a_password_anywhere_in_the_url_is_refused_and_never_shown(url):
    with pytest.raises(InvalidInput, match="carries a password") as refused:
        Settings.from_url(url)
    assert "secret" not in str(refused.value) and ":***@" in str(refused.value)
    assert "secret" not in redact(url)


def test_passwords_come_from_the_environment_and_no_settings_hold_them(monkeypatch):
    monkeypatch.setenv("MAILQ_CASSANDRA_PASSWORD", "cassandra-secret")
    monkeypatch.setenv("MAILQ_AMQP_PASSWORD", "amqp-secret")
    settings = Settings.from_url(DISTRIBUTED)
    assert (settings.cassandra.password(), settings.amqp.password()) == ("cassandra-secret", "amqp-secret")
    for shown in (repr(settings), settings.to_url(), settings.shown()):
        assert "secret" not in shown
