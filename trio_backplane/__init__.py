"""trio_backplane: LLM agent conversations on Trio whose tool calls cross a
strict, durable boundary.

Everything public is importable from here (every name in the ``__all__`` of
``errors``, ``schema``, ``tools``, ``kernel``, ``store``, ``recovery``,
``runtime`` and ``testing``; a test keeps it so); the subpackages hold the
code.  The adapters (optional dependencies) are imported from
``trio_backplane.adapters``.
"""

from __future__ import annotations

from . import errors, kernel, recovery, runtime, schema, store, testing, tools
from .errors import *  # noqa: F403
from .kernel import *  # noqa: F403
from .recovery import *  # noqa: F403
from .runtime import *  # noqa: F403
from .schema import *  # noqa: F403
from .store import *  # noqa: F403
from .testing import *  # noqa: F403
from .tools import *  # noqa: F403

__version__ = "0.1.0"

__all__ = ["__version__"]
__all__ += errors.__all__
__all__ += schema.__all__
__all__ += tools.__all__
__all__ += kernel.__all__
__all__ += store.__all__
__all__ += recovery.__all__
__all__ += runtime.__all__
__all__ += testing.__all__
