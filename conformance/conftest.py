"""Make ``fetch`` and ``suite`` (plain modules of this directory) importable.

``conformance/`` is deliberately not a package (no ``__init__.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
