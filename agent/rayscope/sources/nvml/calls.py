"""What every NVML reader shares: the one call wrapper (:func:`query`, nvitop's ``nvmlQuery``),
the error an old library raises, NVML's strings as text, and the newest version of a
versioned call that this pynvml names and this driver exports.

Through the real ``pynvml`` binding. The readers (:mod:`rayscope.sources.nvml.devices`,
:mod:`rayscope.sources.nvml.health`, :mod:`rayscope.sources.nvml.modes`) decide what a failure means
for their own fields, as :func:`query`'s arguments: an error, or a quiet "not supported".
"""

from collections.abc import Collection, Sequence
from typing import Any, Callable, Optional, TypeVar

import pynvml

T = TypeVar("T")

LIBRARY_TOO_OLD = getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError)
"""The error pynvml raises (not an NVMLError) when it calls an unversioned entry point this
driver's NVML lacks; the versioned calls raise ``NVMLError(FUNCTION_NOT_FOUND)`` instead."""


TOO_OLD = "Function Not Found (NVML library older than this query)"
"""The reason kept for a query this NVML library (or this pynvml) does not have."""
ABSENT = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
"""A query the driver does not have or this GPU does not support: the field is absent, not failed."""


class GpuLost(Exception):
    """NVML answered GPU is lost (``query(..., lost=True)``): the whole GPU, not one field."""


def query(
    errors: Optional[dict[str, str]],
    name: str,
    read: Callable[[], T],
    *,
    quiet: Collection[int] = (),
    lost: bool = False,
) -> Optional[T]:
    """One NVML query (``read``): its value, or ``None`` when NVML refuses it, the reason kept
    as ``errors[name]``. Quietly ``None`` (no reason kept) when the refusal's code is in
    ``quiet``, or always where ``errors`` is ``None``; a library or pynvml too old for the
    query counts as ``FUNCTION_NOT_FOUND``. ``lost``: GPU is lost raises :class:`GpuLost`."""
    try:
        return read()
    except pynvml.NVMLError as err:
        if lost and err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost from None
        reason, code = text(err), err.value
    except (LIBRARY_TOO_OLD, AttributeError):  # AttributeError: this pynvml predates the call
        reason, code = TOO_OLD, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    if errors is not None and code not in quiet:
        errors[name] = reason
    return None


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
