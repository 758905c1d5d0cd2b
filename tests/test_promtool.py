"""Prometheus's own tools on what rayscope ships: ``promtool check metrics`` on every golden
``.prom`` file and on a status that carries every family, ``promtool check rules`` and
``promtool test rules`` on deploy/prometheus/.

promtool is Debian's ``prometheus`` package (``.ci/run`` installs it); without it these tests
fail, they do not skip. The live ``/metrics`` of a head is linted in tests/test_live_prometheus.py.

Positive control: the names before the rename (``legacy_names=True``) fail the linter with
exactly its complaint about ``rayscope_cpus_total`` and ``rayscope_gpus_total``
(:func:`test_legacy_names_fail_the_linter_and_carry_the_same_samples`).
"""

import re
from pathlib import Path

import msgspec
import pytest

from rayscope.core.isolation import unreadable
from rayscope.render.metrics import RENAMED, family_names, metrics_text
from rayscope.schema.report import GpuDevice, GpuHealth
from rayscope.schema.status import ClusterStatus, DeviceFree, NodePlacement
from tests.golden import GOLDEN
from tests.scenarios import a100_worker, pending_status
from tests.support.deploy import RULES_DIR
from tests.support.promtool import lint, promtool

NODE = "4a" * 28
BROKEN = "b0" * 28
"""A node whose report could not be merged or rendered (rayscope.core.isolation)."""
UUID = "GPU-00000000-5f1c-4d3e-9a7b-000000000000"
GIB = 1024**3


def every_family_status() -> ClusterStatus:
    """A status with a sample in every family /metrics has: the recorded pending cluster plus
    a fresh A100 worker with NVML's health fields and Ray's per-device placement, measured."""
    health = GpuHealth(
        xid_errors=2,
        last_xid=79,
        ecc_uncorrected_volatile=3,
        retired_pages_pending=False,
        remapped_rows_pending=True,
        row_remap_failure=False,
        clock_throttle_reasons=0x48,
    )
    gpu = GpuDevice(
        index=0,
        uuid=UUID,
        memory_total_bytes=40 * GIB,
        memory_used_bytes=22 * GIB,
        temperature_c=61,
        power_draw_mw=245_000,
        power_limit_mw=400_000,
        health=health,
        virtualization_mode="passthrough",
        compute_mode="default",
        mps_serving=False,
    )
    device = DeviceFree(
        gpu_id=0,
        visible_id="0",
        uuid=UUID,
        booked_gpu=0.5,
        booked_vram_mb=20480,
        memory_used_bytes=22 * GIB,
        memory_total_bytes=40 * GIB,
    )
    worker = a100_worker(
        NODE,
        gpus=[gpu],
        total_gpu_memory=40 * GIB,
        used_gpu_memory=22 * GIB,
        total_vram_mb=40960,
        used_vram_mb=20480,
        used_gpu=0.5,
        report_age_s=1.5,
        agent="reporting",
        placement=NodePlacement(devices=[device]),
        shared_gpus={UUID: ["another-node"]},
    )
    status = pending_status()
    broken = unreadable(
        a100_worker(BROKEN), BROKEN, "ValueError: invalid literal for int() with base 10: '²'"
    )
    nodes = {**status.nodes, NODE: worker, BROKEN: broken}
    return msgspec.structs.replace(status, nodes=nodes, scheduler_age_s=2.0)


def families(text: str) -> list[str]:
    return [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]


def samples(text: str, name: str) -> list[str]:
    """The sample lines of family ``name``, without the name."""
    return [line[len(name) :] for line in text.splitlines() if re.match(rf"{name}[{{ ]", line)]


GOLDEN_PROM = sorted(GOLDEN.glob("*.prom"))


def test_there_are_golden_prom_files() -> None:
    assert [p.name for p in GOLDEN_PROM] == [
        "metrics_multigpu.prom",
        "status_mixed.prom",
        "status_pending.prom",
        "status_virtual.prom",
    ]


@pytest.mark.parametrize("path", GOLDEN_PROM, ids=lambda p: p.name)
def test_golden_prom_passes_promtool_check_metrics(path: Path) -> None:
    done = lint(path.read_text())
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_every_family_passes_promtool_check_metrics() -> None:
    """All families at once, counters among them (the goldens carry no GPU health)."""
    text = metrics_text(every_family_status())
    assert families(text) == family_names()  # every one of them is linted here
    assert "# TYPE rayscope_gpu_xid_errors_total counter" in text
    assert "# TYPE rayscope_gpu_ecc_uncorrected_volatile_errors_total counter" in text
    done = lint(text)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_legacy_names_fail_the_linter_and_carry_the_same_samples() -> None:
    status = every_family_status()
    current = metrics_text(status)
    legacy = metrics_text(status, legacy_names=True)
    assert not any(old in families(current) for old in RENAMED)  # by default: the new names only
    assert legacy.startswith(current[:-1])  # the old families come after all of today's
    for old, new in RENAMED.items():
        assert samples(legacy, old) == samples(current, new) != [], old
        assert f"# TYPE {old} gauge" in legacy
        assert (
            f"# HELP {old} Deprecated: renamed {new} (same samples); rayscope 0.3 drops this name." in legacy
        )
    done = lint(legacy)
    assert done.returncode == 3  # promtool: lint problems found
    assert sorted((done.stdout + done.stderr).splitlines()) == [
        'rayscope_cpus_total non-counter metrics should not have "_total" suffix',
        'rayscope_gpus_total non-counter metrics should not have "_total" suffix',
    ]


def test_alert_rules_pass_promtool_check_rules() -> None:
    done = promtool("check", "rules", "rayscope-alerts.yml", cwd=RULES_DIR)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_alert_rules_pass_their_unit_tests() -> None:
    done = promtool("test", "rules", "rayscope-alerts.test.yml", cwd=RULES_DIR)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_alert_rules_name_only_families_that_exist() -> None:
    """A renamed or misspelt metric in a rule matches nothing, and the rule never fires."""
    text = (RULES_DIR / "rayscope-alerts.yml").read_text()
    named = set(re.findall(r"\brayscope_[a-z_]*[a-z]\b", text))
    assert named and named <= set(family_names()), named - set(family_names())


def test_an_answer_says_whether_it_carries_the_per_device_families() -> None:
    """/metrics without ?gpus=1 had no rayscope_device_* family and said nothing, so
    the dashboard's per-GPU panels stayed empty and two alerts could never fire. Every answer
    now says which (``rayscope_scrape_per_device``), and RayscopePerDeviceMetricsMissing
    fires on 0 (its unit test in rayscope-alerts.test.yml)."""
    with_devices = every_family_status()
    without = msgspec.structs.replace(
        with_devices,
        nodes={k: msgspec.structs.replace(n, placement=None) for k, n in with_devices.nodes.items()},
    )
    assert "rayscope_scrape_per_device 1\n" in metrics_text(with_devices)
    text = metrics_text(without)
    assert "rayscope_scrape_per_device 0\n" in text
    assert not [
        line for line in text.splitlines() if line.startswith(("rayscope_device_", "# TYPE rayscope_device_"))
    ]
