"""rayscope: booked vs measured GPU state of a Ray cluster, per node and rolled up."""

__version__ = "0.1.0"

SUPPORTED_RAY = ("2.33.0", "2.60.0")
"""Oldest and newest Ray release `make compat` passes (tests/compat.py); pyproject.toml,
README.md and --help state the same range, checked by tests/test_raycompat.py."""
SUPPORTED_PYTHON = ("3.9", "3.13")
