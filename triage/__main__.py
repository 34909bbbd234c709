"""`python -m triage`: the same command line as `triage`."""

import sys

from .cli import main

sys.exit(main())
