"""The pipeline's outputs in the deployment's object store, through Hadoop's `s3a://` file system
(hadoop-aws): what lets a Spark cluster's driver and workers share no disk.

Spark fetches hadoop-aws and the AWS SDK modules s3a uses from Maven Central itself (`spark.jars.packages`,
cached under `~/.ivy2.5.2`) and hands them to its executors. Everything s3a is told comes from the
deployment's URL: the endpoint, its region and the CA that verifies it; the credentials come from the
AWS chain of each process (the environment of the driver and of the Spark workers, or an instance role),
never from a Spark setting, so nothing secret is in a run's config.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from mailq_runtime.errors import InvalidInput, shown
from mailq_runtime.settings import S3Settings

from .cache import CACHE_DIR

# hadoop-aws must be the Hadoop that PySpark bundles (its hadoop-client-api jar); the SDK version is the
# one that hadoop-aws release is built against (hadoop-project's aws-java-sdk-v2.version).
HADOOP_VERSION = "3.5.0"
AWS_SDK_VERSION = "2.35.4"
PACKAGES = (
    f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
    f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}",
    f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}",
)
# The SDK's 650 MB bundle, replaced by the modules above; and its Netty client, whose Netty would sit
# beside Spark's own (s3a's requests go through the Apache client).
EXCLUDES = ("software.amazon.awssdk:bundle", "software.amazon.awssdk:netty-nio-client")
SCHEME = "s3a://"
DEFAULT_REGION = "us-east-1"
TRUST_STORE_PASSWORD = "mailq-ca"  # guards nothing: the store holds one public certificate


def is_s3a(location: str) -> bool:
    return location.startswith(SCHEME)


def bucket_of(location: str) -> str:
    bucket = location[len(SCHEME) :].split("/", 1)[0]
    if not bucket:
        raise InvalidInput(f"invalid pipeline location {shown(location)}: expected s3a://<bucket>/<path>")
    return bucket


def region(s3: S3Settings) -> str:
    """The deployment's region, else the AWS chain's variable, else us-east-1 (what S3 APIs other than
    AWS's accept): s3a signs its requests for it."""
    return s3.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def spark_settings(location: str, s3: S3Settings, ca: Path | None) -> dict[str, str]:
    """The Spark settings for outputs at `location`, an s3a:// URI of the object store of `s3`: the
    packages, and the endpoint settings of its bucket only (`fs.s3a.bucket.<bucket>.*`), so other buckets
    keep s3a's defaults. A CA file becomes a JVM trust store in CACHE_DIR, which the driver reads in place
    and Spark copies to each executor (`spark.files`)."""
    bucket = f"spark.hadoop.fs.s3a.bucket.{bucket_of(location)}."
    settings = {
        "spark.jars.packages": ",".join(PACKAGES),
        "spark.jars.excludes": ",".join(EXCLUDES),
        bucket + "endpoint.region": region(s3),
    }
    if s3.endpoint is not None:
        settings[bucket + "endpoint"] = s3.endpoint
        # Other S3 APIs name the bucket in the path, not in a host name of its own.
        settings[bucket + "path.style.access"] = "true"
        settings[bucket + "connection.ssl.enabled"] = str(s3.endpoint.startswith("https://")).lower()
    if ca is not None and s3.endpoint is not None and s3.endpoint.startswith("https://"):
        store = trust_store(ca, CACHE_DIR)
        trust = (
            f"-Djavax.net.ssl.trustStorePassword={TRUST_STORE_PASSWORD} -Djavax.net.ssl.trustStoreType=PKCS12"
        )
        settings["spark.files"] = str(store)
        settings["spark.driver.extraJavaOptions"] = f"-Djavax.net.ssl.trustStore={store} {trust}"
        # An executor's copy of spark.files is in its working directory.
        settings["spark.executor.extraJavaOptions"] = f"-Djavax.net.ssl.trustStore={store.name} {trust}"
    return settings


def trust_store(ca: Path, directory: Path) -> Path:
    """A PKCS12 trust store holding the CA of `ca` (PEM), made with the JDK's keytool: the JVM verifies
    TLS peers against a trust store, not a PEM file. Made again whenever the CA file is newer."""
    store = directory / "s3a-trust-store.p12"
    if store.exists() and store.stat().st_mtime >= ca.stat().st_mtime:
        return store
    directory.mkdir(parents=True, exist_ok=True)
    store.unlink(missing_ok=True)
    command = [
        "keytool", "-importcert", "-noprompt", "-alias", "mailq-ca", "-file", str(ca),
        "-keystore", str(store), "-storetype", "PKCS12", "-storepass", TRUST_STORE_PASSWORD,
    ]  # fmt: skip
    try:
        made = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise InvalidInput(
            "s3a with a CA file needs the JDK's keytool on PATH (Debian: openjdk-17-jre-headless)"
        ) from None
    if made.returncode != 0:
        raise InvalidInput(f"cannot use the CA file ca={shown(str(ca))} for s3a: {made.stdout.strip()}")
    return store


def fetch_packages() -> None:
    """Resolve PACKAGES into Spark's Ivy cache now, with a local session that starts and stops, so that
    no pipeline run waits on Maven Central (`make s3a-jars`)."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .config("spark.jars.packages", ",".join(PACKAGES))
        .config("spark.jars.excludes", ",".join(EXCLUDES))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    session.stop()


if __name__ == "__main__":
    fetch_packages()
