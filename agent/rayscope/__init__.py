"""rayscope: booked vs measured GPU state of a Ray cluster, per node and rolled up.

The Python API (docs/api.md): :func:`cluster_state`, :func:`fit`, :func:`usage` and the one
exception they raise, :class:`RayscopeError`; each is imported from :mod:`rayscope.client.api` when
first used, so ``import rayscope`` (``status --head``'s fast path starts here) stays cheap.
"""

__version__ = "0.1.0"

SUPPORTED_RAY = ("2.33.0", "2.60.0")
"""Oldest and newest Ray release `make compat` passes (tests/tools/compat.py); pyproject.toml,
README.md and --help state the same range, checked by tests/test_raycompat.py."""
SUPPORTED_PYTHON = ("3.9", "3.13")

__all__ = ["RayscopeError", "__version__", "cluster_state", "fit", "usage"]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from rayscope.client.api import RayscopeError, cluster_state, fit, usage

_API = frozenset(("RayscopeError", "cluster_state", "fit", "usage"))


def __getattr__(name: str) -> object:
    """``rayscope.fit`` and the other public names of :mod:`rayscope.client.api`, imported on first use."""
    if name in _API:
        from rayscope.client import api

        return getattr(api, name)
    raise AttributeError(f"module 'rayscope' has no attribute {name!r}")


def __dir__() -> "list[str]":  # quoted: Python 3.6-3.8 import this file before the version check
    """The module's names and the API's, so that ``help(rayscope)`` and completion list them."""
    return sorted({*globals(), *_API})
