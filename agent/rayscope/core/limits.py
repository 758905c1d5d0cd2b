"""Every numeric option's range and unit, and the one check they all get at parse time.

A value is refused when it is not finite (``nan``, ``inf``: Python's ``float()`` takes both,
and either would reach a timer, a sleep or a sum) or outside its range; the message names
the option, the value as given and the range in the option's unit: ``--timeout nan: not a
number of seconds (more than 0, at most 86400)``. The bounds are the ranges that make sense,
not what a type can hold: a day for a duration (larger is a typo, and overflows the timers it
feeds), a mebibyte count that fits the largest machine.

Pure: the CLI's callbacks (:mod:`rayscope.cli.options`) turn the ``ValueError`` into a usage error.
"""

import math
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


MAX_SECONDS = MAX_TIMEOUT_S
"""The longest duration an option takes (a day)."""

SECONDS = Limit("seconds", 0.0, MAX_SECONDS, low_included=False)
CPUS = Limit("CPUs", 0.0, 65_536.0)
MEBIBYTES = Limit("MB", 0.0, float(1 << 30))
"""Ray memory per replica: up to a pebibyte, in MiB."""
GPU_MEBIBYTES = Limit("MB", 1.0, float(1 << 20))
"""The memory of one GPU: up to a tebibyte, in MiB."""
GPU_MEMORY_MB = Limit("MB", 0.0, float(1 << 20), low_included=False, special=-1, special_means="a whole GPU")
REPLICAS = Limit("replicas", 1.0, 100_000.0)
CONNECTIONS = Limit("connections", 1.0, 1_000_000.0)
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


def check(option: str, value: Number, limit: Limit) -> Number:
    """``value`` if ``limit`` takes it; ``ValueError`` with the whole one-line message:
    ``--timeout nan: not a finite number: give more than 0 and at most 86400 seconds``."""
    if limit.special is not None and value == limit.special:
        return value
    if not math.isfinite(value):
        raise ValueError(f"{option} {_g(value)}: not a finite number: {wanted(limit)}")
    low_ok = value >= limit.low if limit.low_included else value > limit.low
    if not low_ok or value > limit.high:
        raise ValueError(f"{option} {_g(value)}: {wanted(limit)}")
    return value
