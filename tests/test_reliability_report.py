"""RELIABILITY.md's writer (tests/tools/reliability.py): the fuzz run's figures get a section of
their own, and ``make fuzz`` alone replaces that section without touching the fault rows or
the soak figures an earlier ``make reliability`` wrote.

Positive control: make ``replace_section`` write the whole file from the fuzz figures alone
and the fault and soak sections are gone (the second test fails).
"""

import json
from pathlib import Path

from tests.tools import reliability

FIGURES = {
    "inputs": 1000,
    "seed": 7,
    "handled": 1000,
    "unhandled": 0,
    "unhandled_examples": [],
    "outcomes": {"v2 replayed -> replayed": 600, "v2 wrong token -> bad token": 400},
    "seconds": 0.4,
    "finished_at": "2026-12-02 08:00 UTC",
    "python": "3.11.7",
    "machine": "x86_64",
}


def fuzz_file(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps({**FIGURES, **changes}))
    return path


def test_the_whole_file_has_the_fuzz_figures_between_faults_and_soak(tmp_path: Path) -> None:
    text = reliability.render(tmp_path / "no-faults.jsonl", fuzz_file(tmp_path), tmp_path / "no-soak.json")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Faults", "## Fuzz", "## Soak"]
    assert "| v2 replayed -> replayed | 600 |" in text
    assert "1,000 of 1,000 inputs handled, 0 unhandled." in text
    assert "1,000 generated inputs (seed 7) on 2026-12-02 08:00 UTC" in text


def test_make_fuzz_replaces_only_its_own_section(tmp_path: Path) -> None:
    full = reliability.render(tmp_path / "no-faults.jsonl", None, tmp_path / "no-soak.json")
    assert "No fuzz figures" in full
    faults, soak = full.split("## Fuzz")[0], full.split("## Soak")[1]
    once = reliability.replace_section(full, "Fuzz", reliability.fuzz_section(fuzz_file(tmp_path)))
    assert once.startswith(faults) and once.endswith(soak.rstrip("\n") + "\n")
    assert "No fuzz figures" not in once and "| v2 wrong token -> bad token | 400 |" in once
    again = reliability.replace_section(
        once, "Fuzz", reliability.fuzz_section(fuzz_file(tmp_path, unhandled=1, unhandled_examples=["x | y"]))
    )
    assert again.count("## Fuzz") == 1 and again.startswith(faults)
    assert "1,000 of 1,000 inputs handled, 1 unhandled." in again and "- `x \\| y`" in again


def test_a_file_without_the_section_gets_it_before_the_soak(tmp_path: Path) -> None:
    old = "# RELIABILITY\n\n## Faults\n\nrows\n\n## Soak\n\nfigures\n"
    new = reliability.replace_section(old, "Fuzz", reliability.fuzz_section(fuzz_file(tmp_path)))
    assert new.index("## Faults") < new.index("## Fuzz") < new.index("## Soak")
    assert new.endswith("## Soak\n\nfigures\n")
