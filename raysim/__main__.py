"""``python -m raysim``: the same as the ``raysim`` command."""

import sys

from raysim.cli.main import main

sys.exit(main())
