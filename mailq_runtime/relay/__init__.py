"""Remote delivery (issue 25): mail for other domains routed by the transport table or the DNS, sent by
SMTP, retried on Postfix's schedule through the queue's own delays, and bounced with an RFC 3464
notification to its sender. `mailq worker --relay` runs it beside local delivery (worker.py)."""

from .delivery import Outcome, RemoteDelivery
from .routes import Router
from .schedule import RetrySchedule

__all__ = ["Outcome", "RemoteDelivery", "RetrySchedule", "Router"]
