"""``python -m trio_backplane.cli``: the ``backplane`` command."""

import sys

from . import main

sys.exit(main())
