"""The bound docs/usage.md states for the head's usage history: 1,000 actors over a full
window, through the head's own ingest and fold (tests/usage_memory.py, in its own process).

Positive control: give :class:`rayscope.core.usage.window.SlotRing` a Python list per slot instead of its
two arrays (``values = [EMPTY] * n``) and the RSS bound fails; drop the clearing in
``SlotRing.advance`` and the samples per actor exceed one window's slots.
"""

import json
import re
import sys

from tests.conftest import REPO, run_captured

MIB = 1024**2
RSS_BOUND_MIB = 16
STATE_FILE_BOUND_MIB = 16


def test_docs_state_the_bound_this_test_holds() -> None:
    docs = (REPO / "docs" / "usage.md").read_text()
    assert re.search(rf"at most \*\*{RSS_BOUND_MIB} MiB\*\* of the head's memory per 1,000 actors", docs)


def test_a_thousand_actors_over_a_full_window_stay_within_the_bound() -> None:
    done = run_captured([sys.executable, str(REPO / "tests" / "usage_memory.py"), "1000"], timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    print(result)  # the figures docs/usage.md quotes (pytest -s shows them)
    assert result["actors"] == 1000
    assert result["samples_per_actor"] == result["slots"] == 720  # a full window, no more
    assert result["slot_array_bytes"] == 1000 * 720 * 10  # 8 bytes of maximum + 2 of count per slot
    assert result["rss_growth"] <= RSS_BOUND_MIB * MIB
    assert result["state_file_bytes"] <= STATE_FILE_BOUND_MIB * MIB
