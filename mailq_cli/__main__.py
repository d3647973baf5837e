"""`python -m mailq_cli`: the `mailq` console script."""

import sys

from .main import main

sys.exit(main())
