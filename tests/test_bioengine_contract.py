"""BioEngine reads rayscope's ``status --json`` as its own ``get_cluster_state()``: the checks
BioEngine makes of that document, restated here in our own words, run on every golden
status document and on the live embedded and head documents.

Where the rules come from (BioEngine 0.16.1, ``aicell-lab/bioengine`` at ``03b490c``):

* T3-T13: its end-to-end test ``tests/end_to_end/test_worker.py`` (``test_get_status``):
  every number a number and not negative, node GPU memory a number or exactly ``"NA"``
  (``null`` fails), ``node_ip`` a string or ``None``, ``head`` a bool. A key that is absent
  passes, as in BioEngine's test.
* C1-C3: its CLI ``bioengine cluster status`` (``bioengine/cli/cluster.py``), which formats
  the cluster and node numbers with ``:.0f``/``:.1f`` and sorts nodes by ``total_gpu > 0``:
  :func:`bioengine_cli_lines` renders the document the same way and must not raise.
* P1, P3, P4, P6, P7: what its own code writes and indexes (``proxy_actor.py``,
  ``slurm_workers.py``, ``apps/manager.py``): ``slurm_job_id`` always present; the CPU,
  GPU and memory numbers present; ``pending_resources`` an object or absent; a node
  without ``GPU`` has 0 GPU memory and accelerator ``"NA"``; the cluster's GPU memory sums
  are ints, the sums of the node values that are numbers over BioEngine's nodes
  (rayscope's entries with ``alive`` and ``in_scheduler``).

On main's goldens before this (schema 1) these failed: ``status_mixed.json`` T10 ×8
(``null`` GPU memory on four nodes), P6 ×4 (the no-raylet node's memory and accelerator,
the CPU node's accelerator), P7 ×2 (``null`` sums), P4 ×1 (``pending_resources: null``);
``status_pending.json`` T10 ×4, P7 ×2; ``status_seed.json`` and ``status_gpus_seed.json``
P6 ×1 (``accelerator_type: null`` on the CPU-only node) and P4 ×1; main's live embedded
and head documents of the seed cluster (no NVML here, an agent per node for the head):
T10 ×6, P6 ×3 (the CPU node), P7 ×2 each. Nothing failed C1-C3,
T4, T8, T9, T11-T13, P1 or P3. :func:`test_schema_1s_nulls_break_the_contract` keeps that
failure as a positive control.
"""

import contextlib
import http.server
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayscope.client.head import head_status
from rayscope.errors import AgentError
from rayscope.render.status import status_json, status_ndjson
from tests.conftest import LiveCluster, run_rayscope
from tests.golden import GOLDEN
from tests.scenarios import mixed_status
from tests.schemas import parsed
from tests.support import fake_server
from tests.support.bioengine import (
    GPU_MEMORY,
    Document,
    assert_keeps_the_contract,
    bioengine_cli_lines,
    bioengine_problems,
    node_problems,
)
from tests.support.fleet import Fleet

# --- recorded documents ---------------------------------------------------------------------

STATUS_GOLDENS = sorted(p.name for p in GOLDEN.glob("status_*.json"))


@pytest.mark.parametrize("golden", STATUS_GOLDENS)
def test_every_golden_status_document_keeps_bioengines_contract(golden: str) -> None:
    assert_keeps_the_contract(parsed((GOLDEN / golden).read_text(), "status"))


def test_an_append_line_keeps_bioengines_contract() -> None:
    assert_keeps_the_contract(parsed(status_ndjson(mixed_status(), include_dead=True), "status"))


def test_node_documents_booking_keeps_bioengines_node_rules() -> None:
    """``node --json``'s ``booking`` holds the same node objects."""
    doc = parsed((GOLDEN / "node_seed.json").read_text(), "node")
    problems = [p for node_id, node in doc["booking"].items() for p in node_problems(node_id, node)]
    assert doc["booking"] and not problems, problems


def test_bioengines_cli_prints_rayscopes_seed_document() -> None:
    """BioEngine's own line for the seed's nodes (not rayscope's status line: BioEngine has
    no booking segment and labels 1024³ bytes ``GiB``)."""
    lines = bioengine_cli_lines(json.loads((GOLDEN / "status_seed.json").read_text()))
    assert lines == [
        "Cluster: 16/32 CPUs, 1.0/2 GPUs",
        "GPU nodes:",
        "  172.17.0.3 [HEAD] G GPU: 0.0/1 VRAM: 5.8/24.0 GiB  CPU: 8/8",
        "  10.0.0.5 [worker] T4 GPU: 1.0/1 VRAM: 5.8/24.0 GiB  CPU: 6/8",
        "CPU-only nodes:",
        "  10.0.0.7 [worker] CPU: 2/16",
    ]


def test_bioengines_cli_prints_na_for_what_rayscope_does_not_trust() -> None:
    """The stale T4 of ``status_mixed``: its total stays, its used is ``NA`` (BioEngine says
    ``NA`` for a sample older than 30 s); the lost GPU's node is ``NA`` in both."""
    lines = bioengine_cli_lines(json.loads((GOLDEN / "status_mixed.json").read_text()))
    assert "  10.0.0.5 [worker] T4 GPU: 1.0/1 VRAM: NA/24.0 GiB  CPU: 6/8" in lines
    assert "  172.17.0.3 [HEAD] G GPU: 0.0/1 VRAM: NA/NA GiB  CPU: 8/8" in lines


def schema_1(document: Document) -> Document:
    """The document as main wrote it before this: NVML's sums in BioEngine's keys,
    ``null`` where unknown (a stale report's used kept), ``null`` accelerator and cluster
    sums, ``pending_resources`` ``null`` when not read."""
    old: Document = json.loads(json.dumps(document))
    for node in old["nodes"].values():
        node["total_gpu_memory"] = node["total_gpu_memory_bytes"]
        node["used_gpu_memory"] = node["nvml_memory_used_bytes"]
        if node["accelerator_type"] == "NA":
            node["accelerator_type"] = None
    for key in GPU_MEMORY:
        old["cluster"][key] = old["cluster"][key + "_bytes"]
    old["cluster"].setdefault("pending_resources", None)
    return old


def test_schema_1s_nulls_break_the_contract() -> None:
    """Positive control: main's values for ``status_mixed`` fail the checks they failed."""
    problems = bioengine_problems(schema_1(json.loads((GOLDEN / "status_mixed.json").read_text())))
    rules = sorted(p.split(" ", 1)[0] for p in problems)
    assert rules == ["P4"] + ["P6"] * 4 + ["P7"] * 2 + ["T10"] * 8, problems


# --- status --head: the head's document decoded back (agent/rayscope/client/head.py) ----------------------


@contextlib.contextmanager
def serving(body: bytes) -> Iterator[str]:
    """A loopback HTTP server that answers every GET with ``body``; its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with fake_server.serving(server):
        yield f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("golden", ["status_mixed.json", "status_pending.json"])
def test_status_head_decodes_bioengines_types_back_unchanged(golden: str) -> None:
    """``"NA"``, ``0`` and an absent ``pending_resources`` (mixed) or a present one
    (pending) survive the head -> ``status --head`` round trip byte for byte."""
    text = (GOLDEN / golden).read_text()
    with serving(text.encode()) as url:
        status = head_status(url, b"", timeout_s=5.0)
    assert status_json(status, include_dead=True) + "\n" == text


def test_a_schema_1_head_is_refused_by_name() -> None:
    """An older head's ``null`` cannot decode into BioEngine's types: say why, in one line.
    Without the check: ``unexpected answer from head agent ...: Expected `int`, got `null` - at
    `$.cluster.total_gpu_memory```."""
    old = {**schema_1(json.loads((GOLDEN / "status_mixed.json").read_text())), "schema": 1}
    with serving(json.dumps(old).encode()) as url, pytest.raises(AgentError) as refused:
        head_status(url, b"", timeout_s=5.0)
    assert str(refused.value) == (
        f"head agent at {url} serves document schema 1, this rayscope reads schema 2:"
        " run one rayscope release on the head and its clients"
    )


# --- live: the embedded document, and the head's with a push agent per node -------------------


@pytest.mark.live
def test_embedded_document_keeps_bioengines_contract(
    live_cluster: LiveCluster, rayscope_env: dict[str, str], tmp_path: Path
) -> None:
    done = run_rayscope("status", "--json", "--gcs", live_cluster.gcs_address, env=rayscope_env)
    assert done.returncode == 0, done.stderr
    doc = parsed(done.stdout, "status")
    assert_keeps_the_contract(doc)
    cpu = doc["nodes"][live_cluster.node_id("cpu")]
    assert (cpu["total_gpu_memory"], cpu["used_gpu_memory"], cpu["accelerator_type"]) == (0, 0, "NA")
    log = tmp_path / "status.ndjson"
    done = run_rayscope("status", "--append", str(log), "--gcs", live_cluster.gcs_address, env=rayscope_env)
    assert done.returncode == 0, done.stderr
    assert_keeps_the_contract(parsed(log.read_text().splitlines()[-1], "status"))


@pytest.mark.live
def test_head_documents_keep_bioengines_contract(reporting_fleet: Fleet) -> None:
    """``/v1/status`` as served, and as ``status --head`` decodes it back and prints it."""
    code, body = reporting_fleet.head.get("/v1/status?all=1")
    assert code == 200
    served = parsed(body, "status")
    assert served["view"] == "head"
    assert_keeps_the_contract(served)
    decoded = reporting_fleet.status()  # status --head --json --all: decoded, then encoded
    assert_keeps_the_contract(decoded)
    for node_id, node in served["nodes"].items():
        assert node["agent"] == "reporting"
        keys = ("total_gpu_memory", "used_gpu_memory", "accelerator_type")
        assert {k: decoded["nodes"][node_id][k] for k in keys} == {k: node[k] for k in keys}
