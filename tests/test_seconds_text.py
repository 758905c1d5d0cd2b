"""Seconds in a line: what the operator gave, never a deadline's leftover digits.

Before: a read that ran out of the time left of its deadline said ``(timeout 4.86875 s)``
(``%g`` of the seconds left), where the operator had given ``--timeout 5``. One formatter,
``units.seconds``, says every "timeout N s" of the sources and the client.
"""

import pytest

from rayscope.sources.gcs.reader import gcs_error_text
from rayscope.units import seconds


@pytest.mark.parametrize(
    ("value", "text"),
    [(5.0, "5"), (4.86875, "4.87"), (0.25, "0.25"), (0.5, "0.5"), (86400.0, "86400"), (1.005, "1")],
)
def test_seconds_are_said_with_at_most_two_decimals(value: float, text: str) -> None:
    assert seconds(value) == text


def test_a_gcs_timeout_says_its_seconds_rounded() -> None:
    said = gcs_error_text(TimeoutError("timed out"), "127.0.0.1:6379", 4.86875, None)
    assert said == "GCS unreachable at 127.0.0.1:6379 (timeout 4.87 s)"
