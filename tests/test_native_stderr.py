"""Peer text never reaches a terminal raw, Ray's own logs included.

A GCS (tests/fake_grpc_gcs.py) fails every call with an error text that carries escape
sequences. Ray's C++ client in the head's process writes it to fd 2 on every read
(``gcs_client.cc: Failed to get cluster ID from GCS server: RpcError: ...``), where no Python
code sees it; the read's reason (logged by the poller, shown in ``/healthz``) carried it too.

Before (SECURITY.md): raw ESC and BEL on the head's stderr, one line per read, and in the
reason. Now: fd 2 passes :func:`rayscope.sinks.logs.filtered_stderr` (printable lines, a native line once
per location per interval) and :func:`rayscope.sources.gcs.reader.explain` makes the reason printable.
The part of the run before the filter is installed is the positive control: there the raw
bytes still arrive.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rayscope.sinks.logs import StderrFilter
from tests.conftest import REPO, HeadDaemon, base_env
from tests.fake_grpc_gcs import failing_gcs
from tests.reliability_plugin import FaultRecord
from tests.waiting import eventually

EVIL = "\x1b[2J\x1b]0;owned\x07peer-text"
MARK = "--- filtered from here ---"
READS = """
import sys, time
from rayscope.sinks.logs import filtered_stderr
from rayscope.sources.gcs.reader import GcsReader

reader = GcsReader(sys.argv[1], 20.0)
print(repr(reader.read()[1].reason), flush=True)
time.sleep(0.5)
sys.stderr.write("MARK\\n")
sys.stderr.flush()
with filtered_stderr(interval_s=600.0):
    for _ in range(3):
        print(repr(reader.read()[1].reason), flush=True)
    time.sleep(1.0)
""".replace("MARK", MARK)


@pytest.mark.skipif(sys.platform != "linux", reason="fd 2 as Linux has it")
def test_a_gcs_error_text_reaches_stderr_printable_and_once() -> None:
    with failing_gcs(EVIL) as address:
        done = subprocess.run(
            [sys.executable, "-c", READS, address],
            cwd=REPO,
            env=base_env(),
            capture_output=True,
            timeout=180,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    before, _, after = done.stderr.partition(MARK.encode() + b"\n")
    native = b"Failed to get cluster ID from GCS server"
    assert native in before and b"\x1b[2J" in before  # the control: Ray's own line, raw
    assert b"\x1b" not in after and b"\x07" not in after, after
    assert after.count(native) == 1, after  # three reads, one line (the rest held back)
    assert b"[2J]0;ownedpeer-text" in after  # said, without its control characters
    reasons = done.stdout.decode().splitlines()
    assert len(reasons) == 4 and all("\\x1b" not in r and "\\x07" not in r for r in reasons), reasons
    assert "[2J]0;ownedpeer-text" in reasons[0]


@pytest.mark.fault
@pytest.mark.skipif(sys.platform != "linux", reason="fd 2 as Linux has it")
def test_the_heads_log_has_no_raw_peer_text(tmp_path: Path, fault: FaultRecord) -> None:
    """``rayscope head --gcs`` at that GCS, reading every 0.5 s: its stderr (the journal, a
    terminal) gets Ray's line once and printable, and ``/healthz`` says why there is no view."""
    fault.expect(
        "a GCS that fails every call with escape sequences in its error text (head reading every 0.5 s)",
        "no raw ESC or BEL on the head's stderr; Ray's C++ line once per interval, printable"
        " (before: 15 of 17 log lines in 8 s carried raw ESC)",
    )
    log = tmp_path / "head.log"
    with failing_gcs(EVIL) as address:
        head = HeadDaemon(base_env(), log, ["--gcs", address, "--interval", "0.5", "--timeout", "20"], None)
        try:
            said = eventually(
                lambda: (h := json.loads(head.get("/healthz")[1]))["gcs_poller"]["read_errors"] >= 4 and h,
                60,
                "four failed GCS reads",
            )
        finally:
            head.stop()
    text = log.read_bytes()
    assert b"\x1b" not in text and b"\x07" not in text, text[-2000:]
    assert text.count(b"Failed to get cluster ID from GCS server") == 1, text[-2000:]
    assert said["ok"] is False and "[2J]0;ownedpeer-text" in said["scheduler_view_error"]
    lines = text.splitlines()
    raw = sum(b"\x1b" in line for line in lines)
    reads = said["gcs_poller"]["read_errors"]
    fault.observe(f"{raw} of {len(lines)} log lines with raw ESC after {reads} failed reads; Ray's line once")


def test_the_filter_holds_back_a_native_line_and_counts_it() -> None:
    out: list[bytes] = []
    lines = StderrFilter(out.append, interval_s=600.0)
    native = b"[2026-12-03 18:42:59,111 W 18129 18135] gcs_client.cc:210: Failed: \x1b[2Jx\x07\n"
    lines.feed(native * 3 + b"2026-12-03 18:43:00,000 rayscope.head WARNING GCS: \x1b]0;t\x07y\n" + b"half")
    lines.feed(b" a line\n" + b"z" * 5000)
    assert out == [
        b"[2026-12-03 18:42:59,111 W 18129 18135] gcs_client.cc:210: Failed: [2Jx\n",
        b"2026-12-03 18:43:00,000 rayscope.head WARNING GCS: ]0;ty\n",
        b"half a line\n",
        b"z" * 4096 + b"\n",
    ]
