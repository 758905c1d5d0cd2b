"""The soak's bounded part, in every ``make test``: 200 simulated agents for 10 s against one
head on loopback, and not one latest report lost (``make soak`` runs 2,000 for 60 s)."""

from pathlib import Path

import pytest

from tests.tools.soak import soak

pytestmark = pytest.mark.live


def test_no_latest_report_is_lost_under_a_bounded_soak(tmp_path: Path) -> None:
    """Positive control: have ``HeadState.ingest`` drop every 100th report and a node's last
    ``collected_at`` differs from what the head holds: ``lost_latest_reports`` > 0."""
    figures = soak(agents=200, seconds=10.0, clients=1, work=tmp_path)
    assert figures["agents_that_sent"] == 200 and figures["send_errors"] == 0
    assert figures["lost_latest_reports"] == 0, figures["lost_examples"]
    assert figures["ingest_samples"] > 0 and figures["status_head_s"]
