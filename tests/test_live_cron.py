"""``status --output / --append / --format prom`` and the exit codes, run as cron runs them,
against the real Ray cluster and against a cluster that cannot be reached."""

import os
from pathlib import Path

import pytest

from tests.conftest import LiveCluster, run_rayscope
from tests.schemas import parsed
from tests.support.ports import refused_port

pytestmark = pytest.mark.live


def test_output_is_replaced_by_rename_and_silent(
    live_cluster: LiveCluster, rayscope_env: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "status.json"
    target.write_text("{}\n")
    inode = target.stat().st_ino
    done = run_rayscope(
        "status", "--json", "--output", str(target), "--gcs", live_cluster.gcs_address, env=rayscope_env
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    doc = parsed(target.read_text(), "status")
    assert doc["nodes"][live_cluster.node_id("head")]["used_vram_mb"] == 20480
    assert target.stat().st_ino != inode  # a new file renamed over the old one, not rewritten in place
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_unreachable_cluster_writes_nothing(rayscope_env: dict[str, str], tmp_path: Path) -> None:
    good = tmp_path / "status.json"
    good.write_text('{"good": true}\n')
    log = tmp_path / "status.ndjson"
    log.write_text('{"good": true}\n')
    prom = tmp_path / "status.prom"  # a .json file for Prometheus text is refused
    prom.write_text("rayscope_good 1\n")
    address = f"127.0.0.1:{refused_port()}"
    for args in (
        ["--json", "--output", str(good)],
        ["--append", str(log)],
        ["--format", "prom", "--output", str(prom)],
    ):
        done = run_rayscope("status", *args, "--gcs", address, env=rayscope_env)
        assert done.returncode == 2
        assert done.stderr == f"rayscope: GCS unreachable at {address} (connection refused)\n"
    assert good.read_text() == '{"good": true}\n' and log.read_text() == '{"good": true}\n'
    assert prom.read_text() == "rayscope_good 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json", "status.ndjson", "status.prom"]


def test_append_adds_one_timestamped_document_per_run(
    live_cluster: LiveCluster, rayscope_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "status.ndjson"
    for _ in range(2):
        done = run_rayscope(
            "status", "--append", str(log), "--gcs", live_cluster.gcs_address, env=rayscope_env
        )
        assert (done.returncode, done.stdout) == (0, "")
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    docs = [parsed(line, "status") for line in lines]
    assert docs[0]["timestamp"] < docs[1]["timestamp"] and docs[0]["timestamp"].endswith("Z")
    assert all(d["cluster"]["used_vram_mb"] == 20480 for d in docs)


def test_prom_textfile(live_cluster: LiveCluster, rayscope_env: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "rayscope.prom"
    done = run_rayscope(
        "status",
        "--format",
        "prom",
        "--output",
        str(target),
        "--gcs",
        live_cluster.gcs_address,
        env=rayscope_env,
    )
    assert done.returncode == 0, done.stderr
    text = target.read_text()
    head = live_cluster.node_id("head")
    assert f'rayscope_vram_booked_bytes{{node_id="{head}",node_ip="127.0.0.1"}} {20480 * 1024**2}' in text
    assert f'rayscope_gpus_booked{{node_id="{head}",node_ip="127.0.0.1"}} 0.04' in text
    assert 'rayscope_source_up{source="gcs"} 1' in text
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # readable by node_exporter


def test_embedded_status_is_complete_exit_0(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    """No agent runs anywhere (the embedded default): not partial data."""
    done = run_rayscope("status", "--gcs", live_cluster.gcs_address, env=rayscope_env)
    assert done.returncode == 0 and done.stderr == ""


def test_unwritable_output_is_exit_3(
    live_cluster: LiveCluster, rayscope_env: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "missing" / "status.json"
    done = run_rayscope(
        "status", "--output", str(target), "--gcs", live_cluster.gcs_address, env=rayscope_env
    )
    assert done.returncode == 3
    assert done.stderr == f"rayscope: cannot write {target}: No such file or directory\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
