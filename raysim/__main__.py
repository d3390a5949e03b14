"""``python -m raysim``: the same as the ``raysim`` command."""

import sys

from raysim.cli import main

sys.exit(main())
