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
"""

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

    ``str.isdigit()`` and ``int()`` take non-ASCII digits (``'²'``, ``'٢'``, ``'５'``) and
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
