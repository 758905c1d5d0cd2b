"""Collects one row per fault test for RELIABILITY.md (``make reliability``).

A fault test takes the ``fault`` fixture, names the fault and what must happen, and says
what it saw as it goes::

    def test_gcs_killed(fault: FaultRecord) -> None:
        fault.expect("GCS killed", "status exits 1 within 3 intervals, says how old the view is")
        ...
        fault.observe(f"exit 1 after {waited:.1f} s: {note}")

When ``$RAYSCOPE_RELIABILITY_JSON`` names a file, each such test appends one JSON line to it
after it ran: the fault, the expectation, the observations and the test's outcome (a failed
assertion's first line is kept as the observation). Without it the fixture only records.
"""

import json
import os
import time
from collections.abc import Generator
from typing import Any

import pytest

RESULTS_ENV = "RAYSCOPE_RELIABILITY_JSON"


class FaultRecord:
    """What one fault test expects and what it observed."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.fault = ""
        self.expected = ""
        self.observed: list[str] = []

    def expect(self, fault: str, expected: str) -> None:
        self.fault, self.expected = fault, expected

    def observe(self, text: str) -> None:
        self.observed.append(text)

    def row(self, outcome: str, failure: str = "") -> dict[str, Any]:
        observed = "; ".join(self.observed)
        if failure:
            observed = f"{observed}; FAILED: {failure}" if observed else f"FAILED: {failure}"
        return {
            "fault": self.fault or self.test,
            "expected": self.expected,
            "observed": observed,
            "outcome": outcome,
            "test": self.test,
            "at": time.time(),
        }


_KEY = pytest.StashKey[FaultRecord]()


@pytest.fixture
def fault(request: pytest.FixtureRequest) -> FaultRecord:
    record = FaultRecord(request.node.nodeid)
    request.node.stash[_KEY] = record
    return record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    record = item.stash.get(_KEY, None)
    path = os.environ.get(RESULTS_ENV)
    if record is None or not path:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        failure = ""
        if report.failed:
            text = str(report.longrepr).strip().splitlines()
            failure = next(
                (line[1:].strip() for line in text if line.startswith("E ")), text[-1] if text else ""
            )
        row = record.row(report.outcome, failure[:300])
        with open(path, "a") as out:
            out.write(json.dumps(row) + "\n")
