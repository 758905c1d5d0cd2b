"""Units, defined once: bytes per MiB and GiB, and Ray's fixed-point resource unit; and the
one way each kind of quantity is written as text (:func:`number`, :func:`size`), for the
pure parts and the renderers alike.

``VRAM_MB`` is sized by BioEngine from ``nvidia-smi`` totals, which are MiB, so ``* MIB``
turns a ``VRAM_MB`` amount into bytes. GiB values are printed labelled ``GB`` as
``nvidia-smi`` does.

Ray keeps every resource amount as a fixed-point number with a resolution of 1e-4 (its
``FixedPoint``): ``1 - 0.96`` comes back from the GCS as ``0.040000000000000036``, and any
digit past the fourth is float noise. :func:`ray_round` is the one rounding rule for amounts
shown or compared; :func:`ray_units` counts whole units, as Ray's scheduler compares them.

Numbers from outside (a peer's report, a header, a GCS field, ``CUDA_VISIBLE_DEVICES``, a
file, an environment variable) become numbers here and nowhere else: :func:`parse_count` for
counts and indices, :func:`parse_amount` for amounts and durations. Both take ASCII digits
only (``str.isdigit``, ``int()`` and ``float()`` take ``'²'``, ``'٢'``, ``'５'``, and
``float()`` takes ``nan``, ``inf`` and ``1_0``), refuse the rest by name, and bound the text
before converting it (SECURITY.md, "Hostile input, as a property").
"""

import math

MIB = 1024**2
GIB = 1024**3

RAY_DECIMALS = 4
RAY_UNITS_PER_ONE = 10_000
"""How many of Ray's resource units make 1.0 of a resource."""

ACCELERATOR_PREFIX = "accelerator_type:"
"""Ray's accelerator resource, ``accelerator_type:<token>`` (its token is what users schedule on)."""


def ray_round(amount: float) -> float:
    """``amount`` at Ray's resolution (four decimals)."""
    return round(amount, RAY_DECIMALS)


def ray_units(amount: float) -> int:
    """``amount`` in Ray's fixed-point units: what its scheduler compares."""
    return round(amount * RAY_UNITS_PER_ONE)


def number(value: float) -> str:
    """``8`` for a whole number, ``0.5`` otherwise (``%g``)."""
    return f"{value:.0f}" if value == int(value) else f"{value:g}"


def seconds(value: float) -> str:
    """Seconds as a line says them: at most two decimals, no trailing zeros (``5``, ``0.25``,
    ``4.87``), never a deadline's leftover digits (``4.86875``)."""
    return f"{round(value, 2):g}" if value < 1e6 else f"{value:.0f}"


def size(value: float) -> str:
    """Bytes for reading, not for columns: ``23.2 GB`` or ``150 MB`` (binary units)."""
    return f"{value / GIB:.1f} GB" if value >= GIB else f"{value / MIB:.0f} MB"


ASCII_DIGITS = frozenset("0123456789")
MAX_DIGITS = 19
"""The longest digit string any number rayscope reads from outside may have: 2**63 has 19
digits, and a longer string (``int()`` takes quadratic time past a few thousand digits) is
refused before it is converted."""


def parse_count(text: str, what: str, maximum: int = 2**63 - 1) -> int:
    """``text`` as a non-negative integer, ``[0-9]`` only: the one parser for every number
    that comes from outside (a peer's report, an HTTP header or query, a cookie, a GCS field,
    ``CUDA_VISIBLE_DEVICES``, a state file, an environment variable).

    ``str.isdigit`` and ``int()`` take non-ASCII digits (``'²'``, ``'٢'``, ``'５'``) and
    ``int()`` takes signs, spaces and underscores: none of them is a number here. Raises
    ``ValueError`` naming ``what`` and the refused text (quoted, so controls show escaped)."""
    if not text or len(text) > MAX_DIGITS or not ASCII_DIGITS.issuperset(text):
        raise ValueError(f"{what}: {text[:40]!r} is not a number (digits 0-9 only)")
    value = int(text)
    if value > maximum:
        raise ValueError(f"{what}: {value} is over {maximum}")
    return value


def is_count(text: str) -> bool:
    """Whether :func:`parse_count` takes ``text``: ASCII digits only, at most 19 of them."""
    return bool(text) and len(text) <= MAX_DIGITS and ASCII_DIGITS.issuperset(text)


MAX_AMOUNT_CHARS = 64
"""The longest text :func:`parse_amount` converts: a float's 17 significant digits, a point
and an exponent, with room for leading zeros."""


def _is_amount(text: str) -> bool:
    """``DIGITS[.DIGITS][e[+-]DIGITS]`` (a digit on one side of the point at least), ASCII
    only; without ``re``, which the CLI's fast path does not import."""
    mantissa, e, exponent = text.replace("E", "e").partition("e")
    whole, _, fraction = mantissa.partition(".")
    if not (whole or fraction) or not ASCII_DIGITS.issuperset(whole + fraction):
        return False
    if e:
        digits = exponent[1:] if exponent[:1] in ("+", "-") else exponent
        return 0 < len(digits) <= 3 and ASCII_DIGITS.issuperset(digits)
    return True


def parse_amount(text: str, what: str, maximum: float = 1.7976931348623157e308) -> float:
    """``text`` as a finite, non-negative number (``24576``, ``0.5``, ``1e3``), ASCII digits
    only, at most ``maximum``: the one parser for every amount that comes from outside (a
    raylet's resource list, a duration in an environment variable, a query's percentage).
    No sign, no ``nan``/``inf``, no ``_``, no spaces: ``ValueError`` naming ``what``."""
    if len(text) > MAX_AMOUNT_CHARS or not _is_amount(text):
        raise ValueError(f"{what}: {text[:40]!r} is not a number (digits 0-9, a point, an exponent)")
    value = float(text)
    if not math.isfinite(value) or value > maximum:
        raise ValueError(f"{what}: {text[:40]!r} is over {maximum:g}")
    return value


HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
MAX_HEX_DIGITS = 16
"""The longest hexadecimal digit string taken (2**64 has 17 hex digits): an HTTP chunk size."""


def parse_hex_count(text: str, what: str, maximum: int = 2**63 - 1) -> int:
    """``text`` as a non-negative hexadecimal integer, ``[0-9a-fA-F]`` only: :func:`parse_count`'s
    sibling for the numbers that come in hex (an HTTP chunk size). ``int(text, 16)`` would take
    ``'٢'``, ``'0x1'``, ``'-1'``, ``' 1'`` and ``'1_0'``: none of them is a number here. Raises
    ``ValueError`` naming ``what`` and the refused text."""
    if not text or len(text) > MAX_HEX_DIGITS or not HEX_DIGITS.issuperset(text):
        raise ValueError(f"{what}: {text[:40]!r} is not a hexadecimal number (digits 0-9, a-f only)")
    value = int(text, 16)
    if value > maximum:
        raise ValueError(f"{what}: {value} is over {maximum}")
    return value
