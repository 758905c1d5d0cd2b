"""``help(rayscope)`` documents the Python API, not only the lazy ``__getattr__`` behind it.

Before: pydoc listed ``__getattr__`` and no ``cluster_state``, ``fit``, ``usage`` or
``RayscopeError`` (they are imported on first use, so ``dir(rayscope)`` did not have them).
"""

import pydoc

import rayscope


def test_help_of_the_package_lists_the_api() -> None:
    text = pydoc.plain(pydoc.render_doc(rayscope))
    for name in ("cluster_state(", "fit(", "usage(", "class RayscopeError"):
        assert name in text, name
    assert {"cluster_state", "fit", "usage", "RayscopeError"} <= set(dir(rayscope))
