"""``python -m kvselect``: the command line (see ``kvselect --help``)."""

import sys

from kvselect.cli import main

sys.exit(main())
