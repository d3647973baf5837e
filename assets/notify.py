"""The operator's hook for news a sensor finds (dead letters that grew): off unless MAILQ_DEAD_LETTER_NOTIFY
names one. An http:// or https:// URL gets the news POSTed as a JSON object (a chat webhook, an alert
manager); anything else is a command, split as a shell would split it but run without one, that reads the
JSON object on its standard input (`mail -s 'mailq dead letters' ops@example.org`, a script)."""

import json
import os
import shlex
import subprocess
import urllib.error
import urllib.request

NOTIFY_VARIABLE = "MAILQ_DEAD_LETTER_NOTIFY"
TIMEOUT_SECONDS = 30


def notify(news: dict) -> str:
    """Hand `news` to the configured hook; what became of it, in words for the sensor's log. A hook that
    fails is reported, not raised: the sensor's run request matters more than the message."""
    target = os.environ.get(NOTIFY_VARIABLE, "").strip()
    if not target:
        return f"no notification: {NOTIFY_VARIABLE} is not set"
    body = json.dumps(news).encode()
    # The target is never echoed: a webhook's URL is often its secret.
    if target.startswith(("http://", "https://")):
        request = urllib.request.Request(
            target, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
                return f"notified the webhook (HTTP {response.status})"
        except urllib.error.HTTPError as error:
            return f"the webhook answered HTTP {error.code}"
        except (urllib.error.URLError, OSError, ValueError) as error:
            return f"the webhook failed: {getattr(error, 'reason', None) or type(error).__name__}"
    try:
        command = shlex.split(target)
        done = subprocess.run(command, input=body, capture_output=True, timeout=TIMEOUT_SECONDS)
    except (OSError, ValueError, subprocess.TimeoutExpired) as error:
        return f"the notification command failed: {type(error).__name__}"
    if done.returncode:
        return f"the notification command failed with status {done.returncode}"
    return "notified the command"
