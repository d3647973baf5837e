"""Dagster resources: the live mailq runtime and Spark, configured from the environment."""

from .runtime import MailqRuntime
from .spark import spark_resource

__all__ = ["MailqRuntime", "spark_resource"]
