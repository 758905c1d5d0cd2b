"""Golden files: compare rendered output with ``tests/golden/NAME``.

``make golden`` (``RAYSCOPE_UPDATE_GOLDEN=1``) rewrites them; a reviewer reads the diff.
"""

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("RAYSCOPE_UPDATE_GOLDEN") == "1"


def check_golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(actual)
    assert path.exists(), f"{path} missing: run `make golden` and review the diff"
    assert actual == path.read_text(), f"{name} differs from the golden file (`make golden` rewrites it)"
