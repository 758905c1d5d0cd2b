"""Golden files: compare rendered output with ``tests/golden/NAME``.

``make golden`` (``RAYSCOPE_UPDATE_GOLDEN=1``) rewrites them; a reviewer reads the diff.
A JSON golden must also be a valid document of its schema (``status_*.json`` a status
document, ``fit_*``, ``node_*``: tests/schemas.py), written or compared.
"""

import os
from pathlib import Path

from tests.schemas import parsed

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("RAYSCOPE_UPDATE_GOLDEN") == "1"


def check_golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if name.endswith(".json"):
        parsed(actual, name.split("_", 1)[0])
    if UPDATE:
        path.write_text(actual)
    assert path.exists(), f"{path} missing: run `make golden` and review the diff"
    assert actual == path.read_text(), f"{name} differs from the golden file (`make golden` rewrites it)"
