"""Units, defined once: bytes per MiB and GiB.

``VRAM_MB`` is sized by BioEngine from ``nvidia-smi`` totals, which are MiB, so ``* MIB``
turns a ``VRAM_MB`` amount into bytes. GiB values are printed labelled ``GB`` as
``nvidia-smi`` does.
"""

MIB = 1024**2
GIB = 1024**3
