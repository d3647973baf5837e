"""Where the pipeline keeps what it makes for Spark on this machine (the executors' code zip, a trust store
of a CA): the user's cache, rebuilt whenever it is missing."""

import os
from pathlib import Path

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "mailq")
