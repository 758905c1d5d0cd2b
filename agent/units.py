"""Units, defined once: bytes per MiB and GiB, and Ray's fixed-point resource unit.

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
