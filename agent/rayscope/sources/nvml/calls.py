"""What every NVML reader shares: the error an old library raises, NVML's strings as text, and
the newest version of a versioned call that this pynvml names and this driver exports.

Through the real ``pynvml`` binding. The readers (:mod:`rayscope.sources.nvml.devices`,
:mod:`rayscope.sources.nvml.health`, :mod:`rayscope.sources.nvml.modes`) decide what a failure means
for their own fields: an error, or a quiet "not supported".
"""

from collections.abc import Sequence
from typing import Any, Optional

import pynvml

LIBRARY_TOO_OLD = getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError)
"""The error pynvml raises (not an NVMLError) when it calls an unversioned entry point this
driver's NVML lacks; the versioned calls raise ``NVMLError(FUNCTION_NOT_FOUND)`` instead."""


def text(value: Any) -> str:
    """An NVML string (bytes from older pynvml) or error, as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def newest_list(handle: Any, name: str, versions: Sequence[int]) -> tuple[Optional[list[Any]], Optional[int]]:
    """``pynvml.<name>_v<N>(handle)`` for the first ``N`` of ``versions`` (newest first) that this
    pynvml names and this driver exports: (its entries, ``N``); ``(None, None)`` when none
    does. Any other ``NVMLError`` is raised, for the caller to judge."""
    for version in versions:
        call = getattr(pynvml, f"{name}_v{version}", None)
        if call is None:  # this pynvml predates the version
            continue
        try:
            return list(call(handle)), version
        except pynvml.NVMLError as err:
            if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            # an older driver: try the previous call version
        except LIBRARY_TOO_OLD:
            continue
    return None, None
