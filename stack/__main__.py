"""Run the local stack's command line: `python -m stack up`."""

import sys

from stack.cli import main

sys.exit(main())
