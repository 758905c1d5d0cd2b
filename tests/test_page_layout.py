"""The head's page laid out by Chromium at the two widths an operator meets it at, 1,400 and
700 pixels, without a Ray cluster: the first hour's cluster
(tests/page_scenarios.first_hour_status: Europa measured, a VM whose agent has no NVML, the
deNBI T4 without an agent, the CPU node, two apps in "Bookings beside use") rendered to a
file and opened in Debian's chromium (tests/browser.py). tests/test_live_page.py checks the
same on a real head.

Positive control: the page before this (one GPU's lanes at most 380 px, legend items that
wrap, app lines cut with an ellipsis at 160 px cells) fails all three at 700 px and the first
and last at 1,400 (measured: bar 374 of 1376 px; four legend items off; four app lines cut).
"""

from pathlib import Path
from typing import Any

from rayscope.render.page.document import PageQuery, page_html
from tests.browser import Browser
from tests.page_scenarios import first_hour_status, first_hour_usage
from tests.scenarios import T4
from tests.support.page import BADGES, LAYOUT


def test_the_page_reads_at_1400_and_700_pixels(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text(page_html(first_hour_status(), PageQuery(), 5.0, first_hour_usage()))
    (tmp_path / "chromium").mkdir()
    browser = Browser(tmp_path / "chromium", width=1400, height=900)
    laid: dict[int, Any] = {}
    try:
        browser.navigate(page.as_uri())
        assert browser.evaluate(BADGES) == [["no agent", T4]]
        for width in (1400, 700):
            browser.at_width(width)
            laid[width] = browser.evaluate(LAYOUT)
            browser.screenshot_whole(tmp_path / f"page-{width}.png", width)
    finally:
        browser.close()
    for width, found in laid.items():
        assert found["bar"] > 0.9 * found["node"], (width, found)
        assert found["keys_off"] == [] and found["cut"] == [], (width, found)
        assert (tmp_path / f"page-{width}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
