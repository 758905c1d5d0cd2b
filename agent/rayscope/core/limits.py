"""Every numeric option's range and unit, and the one check they all get at parse time.

A value is refused when it is not a number (``4GB``, ``5s``: the unit is the option's, the
number goes alone), not a whole number where the option counts (``--replicas 1.5``), not
finite (``nan``, ``inf``: Python's ``float()`` takes both, and either would reach a timer, a
sleep or a sum) or outside its range; the message names the option, the value as given and
the range in the option's unit: ``--timeout nan: not a finite number: give more than 0 and at
most 86400 seconds``. The bounds are the ranges that make sense,
not what a type can hold: a day for a duration (larger is a typo, and overflows the timers it
feeds), a mebibyte count that fits the largest machine.

Pure: the CLI's callbacks (:mod:`rayscope.cli.options`) turn the ``ValueError`` into a usage error.
"""

import math
import re
from typing import NamedTuple, Optional, Union

from rayscope.defaults import MAX_TIMEOUT_S

Number = Union[int, float]


class Limit(NamedTuple):
    """What a numeric option takes: ``low`` to ``high`` in ``unit`` (``low`` itself only when
    ``low_included``), and ``special``, a value outside the range with its own meaning."""

    unit: str
    low: float
    high: float
    low_included: bool = True
    special: Optional[int] = None
    special_means: str = ""
    whole: bool = False
    """A count: only whole numbers (``1e3`` is one, ``0.5`` is not)."""


MAX_SECONDS = MAX_TIMEOUT_S
"""The longest duration an option takes (a day)."""

SECONDS = Limit("seconds", 0.0, MAX_SECONDS, low_included=False)
CPUS = Limit("CPUs", 0.0, 65_536.0)
MEBIBYTES = Limit("MB", 0.0, float(1 << 26))
"""Ray memory per replica, in MiB: up to 64 TiB, above the largest single machine's memory
(48 TB): a replica books memory on one node. (A pebibyte let ``--memory-mb 1e9`` through.)"""
GPU_MEBIBYTES = Limit("MB", 1.0, float(1 << 20))
"""The memory of one GPU: up to a tebibyte, in MiB."""
GPU_MEMORY_MB = Limit(
    "MB", 0.0, float(1 << 20), low_included=False, special=-1, special_means="a whole GPU", whole=True
)
REPLICAS = Limit("replicas", 1.0, 100_000.0, whole=True)
CONNECTIONS = Limit("connections", 1.0, 1_000_000.0, whole=True)
HEADROOM = Limit("percent", 0.0, 1000.0)
"""``usage --headroom``: the booking suggested above a peak (``/v1/usage?headroom=`` too)."""


def _g(value: float) -> str:
    """``86400``, ``0.5``, ``nan``: whole numbers without an exponent, as an operator types them."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


def wanted(limit: Limit) -> str:
    """``give more than 0 and at most 86400 seconds``: what the option takes, in its unit."""
    if limit.low_included:
        text = f"give {_g(limit.low)} to {_g(limit.high)} {limit.unit}"
    else:
        text = f"give more than {_g(limit.low)} and at most {_g(limit.high)} {limit.unit}"
    if limit.special is not None:
        text += f", or {limit.special} for {limit.special_means}"
    return text


def check(option: str, value: Number, limit: Limit, given: str = "") -> Number:
    """``value`` if ``limit`` takes it; ``ValueError`` with the whole one-line message:
    ``--timeout nan: not a finite number: give more than 0 and at most 86400 seconds``.
    ``given``: the value as typed, for the message (else the number as an operator types it)."""
    shown = given or _g(value)
    if limit.special is not None and value == limit.special:
        return value
    if not math.isfinite(value):
        raise ValueError(f"{option} {shown}: not a finite number: {wanted(limit)}")
    if limit.whole and value != int(value):
        raise ValueError(f"{option} {shown}: not a whole number: {wanted(limit)}")
    low_ok = value >= limit.low if limit.low_included else value > limit.low
    if not low_ok or value > limit.high:
        raise ValueError(f"{option} {shown}: {wanted(limit)}")
    return int(value) if limit.whole else value


_WITH_A_UNIT = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*[^\d\s.].*")
"""A number with words after it: ``4GB``, ``5s``, ``10 %``."""


def parse(option: str, text: str, limit: Limit) -> Number:
    """The option's value from its text (what the command line or the environment gave),
    checked by :func:`check`; ``ValueError`` with the whole one-line message:
    ``--gpu-memory-mb 4GB: the number alone, in MB: give more than 0 and at most 1048576 MB,
    or -1 for a whole GPU``."""
    try:
        value = float(text)
    except ValueError:
        what = f"the number alone, in {limit.unit}" if _WITH_A_UNIT.fullmatch(text) else "not a number"
        raise ValueError(f"{option} {text}: {what}: {wanted(limit)}") from None
    return check(option, value, limit, given=text.strip())
