"""Cron-safe output: ``status`` exit codes, the node_exporter textfile, NDJSON lines, and
atomic files that a reader polling them never sees half-written — even when the writer is
SIGKILLed at random points (a few hundred times, bounded in time).

Positive control for the atomicity test: the same kills against a naive writer
(``open(path, "w").write(...)``) make the same reader see a broken document.
"""

import json
import os
import random
import re
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rayscope.core import completeness
from rayscope.core.completeness import completeness_note
from rayscope.errors import AgentError
from rayscope.render.metrics import metrics_text
from rayscope.render.status import status_json, status_ndjson
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import ClusterStatus
from rayscope.sinks import files
from tests.conftest import REPO, base_env, run_rayscope
from tests.golden import check_golden
from tests.scenarios import (
    NOW,
    T4,
    UNKNOWN,
    embedded_seed_status,
    mixed_status,
    seed_status,
)
from tests.schemas import parsed

# --- exit codes ---------------------------------------------------------------------------


def test_every_agent_fresh_is_complete() -> None:
    assert completeness.status_exit_code(seed_status()) == 0
    assert completeness_note(seed_status()) is None


def test_embedded_default_without_agents_is_complete() -> None:
    """Nodes that simply run no agent are not partial data."""
    status = embedded_seed_status()
    assert all(n.agent == "none" for n in status.nodes.values())
    assert completeness.status_exit_code(status) == 0


def test_a_stale_agent_report_is_partial() -> None:
    status = mixed_status()
    assert completeness.status_exit_code(status) == 1
    assert completeness_note(status) == "partial: stale report from 1 node(s): 10.0.0.5 (42s)"


def test_a_dead_nodes_stale_report_is_not_partial() -> None:
    status = mixed_status()
    t4 = msgspec.structs.replace(status.nodes[T4], alive=False)
    assert completeness.status_exit_code(msgspec.structs.replace(status, nodes={**status.nodes, T4: t4})) == 0


def test_scheduler_view_missing_while_agents_report_is_partial() -> None:
    status = msgspec.structs.replace(
        seed_status(),
        sources=[SourceStatus(name="gcs", ok=False, reason="GCS unreachable at x:1 (timeout 5 s)")],
        scheduler_age_s=None,
    )
    assert completeness.status_exit_code(status) == 1
    assert completeness_note(status) == (
        "partial: no scheduler view (GCS unreachable at x:1 (timeout 5 s)):"
        " only the agents' reports are shown"
    )


def test_nothing_at_all_is_no_data() -> None:
    empty = ClusterStatus(generated_at=NOW, view="head", cluster=seed_status().cluster, nodes={})
    assert completeness.status_exit_code(empty) == 2
    assert completeness_note(empty) == "no data: no node in the scheduler's view and no agent report"
    failed = [SourceStatus(name="gcs", ok=False, reason="GCS unreachable at x:1 (timeout 5 s)")]
    no_view_no_agent = msgspec.structs.replace(embedded_seed_status(), sources=failed)
    assert completeness.status_exit_code(no_view_no_agent) == 2
    assert completeness_note(no_view_no_agent) == (
        "no data: no node in the scheduler's view (GCS unreachable at x:1 (timeout 5 s)) and no agent report"
    )


def test_help_documents_the_exit_codes() -> None:
    env = base_env(COLUMNS="200")
    status = " ".join(run_rayscope("status", "--help", env=env).stdout.split())
    assert all(code in status for code in ("Exit 0: complete", "Exit 1: partial", "Exit 2: no data"))
    assert "Exit 3: the --output or --append FILE could not be written" in status
    fit = " ".join(run_rayscope("fit", "--help", env=env).stdout.split())
    assert all(code in fit for code in ("Exit 0: fits", "Exit 1: does not fit", "Exit 2: could not tell"))


# --- node_exporter textfile format ---------------------------------------------------------

SAMPLE = re.compile(
    r'^(rayscope_[a-z_]+)(\{[a-z_]+="(?:[^"\\]|\\.)*"(?:,[a-z_]+="(?:[^"\\]|\\.)*")*\})? (-?[0-9.e+]+)$'
)


def test_prom_textfile_is_well_formed() -> None:
    """``status --format prom`` writes the head's /metrics text (metrics_text): what
    node_exporter's textfile collector requires of it — HELP and TYPE once per family, before
    its samples, samples of a family together, valid names, labels and numbers."""
    text = metrics_text(mixed_status())
    assert text.endswith("\n")
    seen: list[str] = []
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in seen, f"{name} twice"
            seen.append(name)
            current = name
        elif line.startswith("# TYPE "):
            assert line == f"# TYPE {current} gauge"
        else:
            match = SAMPLE.match(line)
            assert match, line
            assert match.group(1) == current, line
    assert all(name.startswith("rayscope_") for name in seen)


def test_prom_carries_the_three_gpu_numbers_with_units_and_node_labels() -> None:
    text = metrics_text(seed_status())
    labels = 'node_id="' + "e0" * 28 + '",node_ip="172.17.0.3"'
    assert f"rayscope_gpus_booked{{{labels}}} 0.04" in text
    assert f"rayscope_vram_booked_bytes{{{labels}}} {20480 * 1024**2}" in text  # MiB, in bytes
    assert f"rayscope_vram_capacity_bytes{{{labels}}} {24576 * 1024**2}" in text
    assert f"rayscope_gpu_memory_used_bytes{{{labels}}} {int(5.8 * 1024**3)}" in text


def test_prom_leaves_out_what_nobody_measured() -> None:
    """No NVML sample for the node no agent reports: absent, not 0."""
    text = metrics_text(mixed_status())
    assert 'rayscope_gpus_capacity{node_id="' + "0a" * 28 in text
    assert 'rayscope_gpu_memory_used_bytes{node_id="' + "0a" * 28 not in text


def test_prom_leaves_out_a_stale_reports_memory() -> None:
    """The T4's report is 42 s old: flagged stale, its NVML numbers absent (not old values)."""
    text = metrics_text(mixed_status())
    assert f'rayscope_report_stale{{node_id="{T4}",node_ip="10.0.0.5"}} 1' in text
    assert f'rayscope_gpu_memory_used_bytes{{node_id="{T4}"' not in text


def test_a_gone_nodes_stale_report_is_not_partial() -> None:
    """An agent's node the scheduler does not know (taken away) whose report went stale."""
    status = mixed_status()
    ghost = msgspec.structs.replace(status.nodes[UNKNOWN], stale=True, agent="stale", report_age_s=60.0)
    fresh_t4 = msgspec.structs.replace(status.nodes[T4], stale=False, agent="reporting")
    nodes = {**status.nodes, T4: fresh_t4, UNKNOWN: ghost}
    assert completeness.status_exit_code(msgspec.structs.replace(status, nodes=nodes)) == 0


def test_prom_label_values_are_escaped() -> None:
    status = seed_status()
    node = msgspec.structs.replace(status.nodes[T4], node_ip='odd "ip"\\name')
    text = metrics_text(msgspec.structs.replace(status, nodes={T4: node}))
    assert 'node_ip="odd \\"ip\\"\\\\name"' in text


def test_golden_prom() -> None:
    check_golden("status_mixed.prom", metrics_text(mixed_status()))


# --- NDJSON -------------------------------------------------------------------------------


def test_ndjson_line_is_one_document_with_a_timestamp() -> None:
    line = status_ndjson(seed_status())
    assert "\n" not in line
    doc = parsed(line, "status")
    assert doc["timestamp"] == "2026-11-30T00:53:20.000Z"
    assert doc["generated_at"] == NOW
    assert doc["nodes"] == json.loads(status_json(seed_status()))["nodes"]


# --- atomic files -------------------------------------------------------------------------


def test_write_atomic_replaces_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    files.write_atomic(str(target), "one\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    target.chmod(0o640)
    files.write_atomic(str(target), "two\n")
    assert target.read_text() == "two\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]  # no temp file left


def test_write_atomic_failure_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(AgentError) as err:
        files.write_atomic(str(tmp_path / "missing" / "status.json"), "x")
    assert err.value.exit_code == 3
    assert str(err.value) == f"cannot write {tmp_path / 'missing' / 'status.json'}: No such file or directory"


def test_append_line_adds_exactly_one_line(tmp_path: Path) -> None:
    target = tmp_path / "status.ndjson"
    files.append_line(str(target), '{"a": 1}')
    files.append_line(str(target), '{"a": 2}\n')
    assert target.read_text() == '{"a": 1}\n{"a": 2}\n'


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


WRITER = """
import sys
from rayscope.sinks.files import write_atomic
path, docs = sys.argv[1], [open(p).read() for p in sys.argv[2:]]
write_atomic(path, docs[0])
print("ready", flush=True)
i = 1
while True:
    write_atomic(path, docs[i % len(docs)])
    i += 1
"""
"""Ready once its first document is whole, so that each kill lands in a later write, however
slow a loaded machine makes the first (under load, no writer got past its first document in
0-30 ms and the reader never saw the large one)."""
NAIVE_WRITER = WRITER.replace("from rayscope.sinks.files import write_atomic", "").replace(
    "write_atomic(path, ", "open(path, 'w').write("
)


SMALL, LARGE = 500.0, 1000.0


def _big_documents(tmp_path: Path) -> list[str]:
    """Two status documents of about 0.5 and 1 MB (many nodes), so a write takes long enough
    for a kill to land inside it; ``generated_at`` tells them apart."""
    paths = []
    base = seed_status()
    template = base.nodes[T4]
    for count in (SMALL, LARGE):
        nodes = {
            f"{i:056x}": msgspec.structs.replace(template, node_id=f"{i:056x}") for i in range(int(count))
        }
        doc = status_json(msgspec.structs.replace(base, nodes=nodes, generated_at=float(count)))
        path = tmp_path / f"doc-{count}.json"
        path.write_text(doc)
        paths.append(str(path))
    return paths


READER = """
import json, sys, threading
path, reads, broken, seen = sys.argv[1], 0, [], set()
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
while not stop.is_set():
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        continue
    reads += 1
    try:
        seen.add(json.loads(data)["generated_at"])
    except (ValueError, KeyError):
        broken.append(len(data))
print(json.dumps({"reads": reads, "broken": broken, "seen": sorted(seen)}), flush=True)
"""


def _python(script: str, *args: str, stdin: bool = False) -> "subprocess.Popen[str]":
    # -S: no site import; the writer needs only the source root agent/ (the cwd) and the
    # standard library.
    return subprocess.Popen(
        [sys.executable, "-S", "-c", script, *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        cwd=REPO / "agent",
        env=base_env(),
        text=True,
    )


def _kill_writers(
    script: str, target: Path, docs: list[str], runs: int, budget_s: float
) -> tuple[int, dict[str, Any]]:
    """Start a writer, let it write for a random 0-30 ms after its first whole document, SIGKILL
    it; again, ``runs`` times or
    until ``budget_s`` is spent. A reader process polls the file all along (its own process,
    so its JSON parsing does not slow the test's process starts)."""
    rng = random.Random(6)
    done = 0
    deadline = time.monotonic() + budget_s
    # Each Popen in a with-block: a failed assert still kills, reaps and closes its pipes
    # (a leaked pipe was a ResourceWarning in whichever test ran next).
    with _python(READER, str(target), stdin=True) as reader:
        assert reader.stdout is not None and reader.stdin is not None
        try:
            assert reader.stdout.readline() == "ready\n"
            while done < runs and time.monotonic() < deadline:
                first = done % len(docs)  # the runs take turns at which document comes first
                with _python(script, str(target), *docs[first:], *docs[:first]) as writer:
                    try:
                        assert writer.stdout is not None
                        assert writer.stdout.readline() == "ready\n"
                        time.sleep(rng.uniform(0.0, 0.03))
                    finally:
                        writer.kill()
                done += 1
        finally:
            reader.stdin.close()
            summary: dict[str, Any] = json.loads(reader.stdout.readline() or "{}")
            reader.wait(timeout=30)
    return done, summary


def test_a_polling_reader_never_sees_half_a_file_while_writers_are_killed(tmp_path: Path) -> None:
    docs = _big_documents(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "status.json"
    # A fixed number of kills, not as many as fit in a time: a loaded CI machine would test
    # less (this once failed "only 93 writer runs in the time budget"). The budget is a hang guard.
    runs, reader = _kill_writers(WRITER, target, docs, runs=150, budget_s=900.0)
    assert runs == 150, f"the hang guard stopped the test after {runs} writer runs"
    assert reader["broken"] == [], (
        f"{len(reader['broken'])} of {reader['reads']} reads were not a whole document"
    )
    assert reader["reads"] > runs and reader["seen"] == [SMALL, LARGE]
    json.loads(target.read_text())
    # Kills landed inside writes: their temp files are left behind (hidden, never *.tmp → *.prom).
    leftovers = [p.name for p in out_dir.iterdir() if p.name != "status.json"]
    assert leftovers and all(re.fullmatch(r"\.status\.json\..+\.tmp", name) for name in leftovers)


def test_positive_control_a_naive_writer_is_caught(tmp_path: Path) -> None:
    docs = _big_documents(tmp_path)
    target = tmp_path / "status.json"
    _, reader = _kill_writers(NAIVE_WRITER, target, docs, runs=30, budget_s=900.0)
    assert reader["broken"], "the reader should catch a truncate-then-write writer"
