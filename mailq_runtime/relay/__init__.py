"""Remote delivery: mail for other domains routed by the transport table or the DNS, sent by
SMTP, retried on Postfix's schedule through the queue's own delays, and bounced with an RFC 3464
notification to its sender, within per-destination limits kept in the metadata store (limits.py).
`mailq worker --relay` runs it beside local delivery (worker.py)."""

from .delivery import Outcome, RemoteDelivery
from .limits import DestinationLimits, Limiter
from .routes import Router
from .schedule import RetrySchedule

__all__ = ["DestinationLimits", "Limiter", "Outcome", "RemoteDelivery", "RetrySchedule", "Router"]
