"""A real Prometheus (Debian's ``prometheus`` binary) scraping a real head on the seed cluster.

One ``rayscope head`` (token on), one ``rayscope push`` per Ray node with the fake NVML (one
RTX 3090 the seed's actors hold, one XID event, ECC and row remapping read), a replica left
waiting for ``VRAM_MB`` so that the pending demand has a sample. Prometheus scrapes the head's
``/metrics?gpus=1`` every second with the bearer token, loads deploy/prometheus's alert rules,
and then every query of deploy/grafana/rayscope.json must return series through
``/api/v1/query``: once with the template variables as "All" (``.*``), once with one real
node, head and GPU.

Positive controls: scraping ``/metrics`` without ``?gpus=1`` leaves the per-device panels
empty (``rayscope_device_*`` come with the actor table's placement only): the fixture's wait
for ``rayscope_device_memory_used_bytes`` fails every test; the over-booking rule without its
``booked > 0`` guard names the deNBI T4's device too (booked by fraction, 0 VRAM_MB) and fails
:func:`test_alert_rules_load_and_judge_the_live_cluster`.
"""

import json
import re
import signal
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest

from tests import debian_deps
from tests import fake_nvml as fake
from tests.conftest import Daemon, HeadDaemon, LiveCluster, base_env, push_agent
from tests.support import http_get
from tests.support.deploy import DASHBOARD, RULES_DIR
from tests.support.promtool import lint, promtool
from tests.waiting import eventually

pytestmark = pytest.mark.live

NODES = ("head", "denbi", "cpu")
UUID = "GPU-00000000-5f1c-4d3e-9a7b-000000000000"  # fake.gpu(0, ...)
GIB = 1024**3
MEASURED_GIB = {
    "federated-unet-0": 4.0,
    "federated-unet-1": 4.2,
    "federated-unet-2": 4.5,
    "federated-unet-3": 5.0,
}
DEVICE_USED_GIB = 22.9  # over the head's 20480 MB booked on it
WAITING = "waits-for-vram"  # 8192 MB asked, 4096 MB left on the only VRAM_MB node
READY_S = 120.0


def scenario(pids: dict[str, int]) -> str:
    lines = fake.HEADER + "count 1\n"
    lines += fake.gpu(0, fake.RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=DEVICE_USED_GIB)
    lines += "gpu0.ecc_uncorrected 0\ngpu0.remapped 0 0 0 0\ngpu0.retired_pending 0\ngpu0.xid 48\n"
    for name, gib in MEASURED_GIB.items():
        lines += fake.process("gpu0", pids[name], gib)
    return lines


LISTENING = re.compile(r'msg="Listening on"[^\n]*? address=127\.0\.0\.1:(\d+)')
"""Prometheus's line naming the port it listens on: the OS's, for port 0 (its line "Start
listening for connections" names the 0 it was given)."""


class Prometheus:
    """``prometheus`` on a loopback port the OS picks (read from its log by
    :meth:`wait_ready`), its storage in ``root``; stopped by pid."""

    def __init__(self, root: Path, config: dict[str, Any]) -> None:
        self.port = 0
        self.log_path = root / "prometheus.log"
        (root / "prometheus.yml").write_text(json.dumps(config, indent=2))  # JSON is YAML
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                debian_deps.need("prometheus"),
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                "--web.listen-address=127.0.0.1:0",
            ],
            cwd=root,
            stdout=self._log,
            stderr=self._log,
        )

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        code, body = http_get.get(url)
        assert code == 200, (url, code, body[:500])
        return json.loads(body)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """``/api/v1/query`` now: the instant vector's series (an error fails the test)."""
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited {self.process.returncode}:\n{self.log_path.read_text()}"
                )
            if not self.port:
                listening = LISTENING.search(self.log_path.read_text())
                if listening is None:
                    return False
                self.port = int(listening.group(1))
            # 503 until it is ready: an answer, closed (a kept HTTPError would leak its socket)
            return http_get.get(f"http://127.0.0.1:{self.port}/-/ready", timeout_s=5)[0] == 200

        eventually(
            ready, timeout_s, "prometheus ready", 0.2, retry=(OSError,), detail=self.log_path.read_text
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


class Scraped(NamedTuple):
    prometheus: Prometheus
    head: HeadDaemon
    cluster: LiveCluster


def scrape_config(head: HeadDaemon, token_file: Path) -> dict[str, Any]:
    """What deploy/prometheus/README.md tells an operator to write, at a 1 s interval."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES_DIR / "rayscope-alerts.yml")],
        "scrape_configs": [
            {
                "job_name": "rayscope",
                "metrics_path": "/metrics",
                "params": {"gpus": ["1"]},
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "static_configs": [{"targets": [f"127.0.0.1:{head.http_port}"]}],
            }
        ],
    }


# What takes longest to appear: the placement (actor table + agents' NVML), the pending demand,
# and two samples of the XID counter for increase().
READY_QUERIES = (
    "rayscope_device_memory_used_bytes",
    "rayscope_pending_demands",
    "rayscope_scheduler_view_age_seconds",
    "count_over_time(rayscope_gpu_xid_errors_total[1m]) >= 3",
    "count(rayscope_report_stale == 0) >= 3",
)


@pytest.fixture(scope="module")
def scraped(
    live_cluster: LiveCluster,
    fake_nvml_lib: fake.FakeNvml,
    wire_token: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Scraped]:
    root = tmp_path_factory.mktemp("prometheus")
    pids = {a["name"]: a["pid"] for a in live_cluster.state["actors"]}
    (root / "nvml.txt").write_text(scenario(pids))
    env = fake_nvml_lib.env(
        base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(live_cluster.root)), root / "nvml.txt"
    )
    head = HeadDaemon(
        env, root / "head.log", ["--gcs", live_cluster.gcs_address, "--interval", "1"], wire_token
    )
    agents: list[Daemon] = []
    prometheus = None
    live_cluster.request(
        op="submit", name=WAITING, options={"num_gpus": 0.01, "num_cpus": 0, "resources": {"VRAM_MB": 8192}}
    )
    try:
        for name in NODES:
            log = root / f"push-{name}.log"
            agents.append(push_agent(head.listen_port, live_cluster.node_id(name), env, log, wire_token))
        prometheus = Prometheus(root, scrape_config(head, wire_token))
        prometheus.wait_ready()
        missing = list(READY_QUERIES)

        def sampled() -> bool:
            missing[:] = [q for q in missing if not prometheus.query(q)]  # one query each until it answers
            return not missing

        def targets() -> str:
            return (
                f"missing: {missing}; targets: {prometheus.get('/api/v1/targets')}\n{head.log_text()[-3000:]}"
            )

        eventually(sampled, READY_S, "samples for every ready query", 0.5, detail=targets)
        yield Scraped(prometheus, head, live_cluster)
    finally:
        if prometheus is not None:
            prometheus.stop()
        live_cluster.request(op="kill_actor", name=WAITING)
        for agent in agents:
            agent.stop()
        head.stop()


def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in doc["panels"] if p["type"] != "row" for t in p["targets"]]


def variable_queries() -> dict[str, str]:
    doc = json.loads(DASHBOARD.read_text())
    return {v["name"]: v["definition"] for v in doc["templating"]["list"] if v["type"] == "query"}


def substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    return expr


def real_values(scraped: Scraped) -> dict[str, str]:
    """One head, the seed's Europa node (VRAM_MB and the fake RTX 3090) and that GPU."""
    return {
        "instance": f"127.0.0.1:{scraped.head.http_port}",
        "node": scraped.cluster.node_id("head"),
        "gpu": UUID,
    }


ALL = {"instance": ".*", "node": ".*", "gpu": ".*"}


def test_every_dashboard_query_returns_series(scraped: Scraped) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    for values in (ALL, real_values(scraped)):
        empty = [
            (title, substitute(e, values))
            for title, e in queries
            if not scraped.prometheus.query(substitute(e, values))
        ]
        assert empty == [], f"panels without data ({values}):\n" + "\n".join(f"{t}: {e}" for t, e in empty)


def test_the_per_gpu_panels_show_booked_beside_measured(scraped: Scraped) -> None:
    """The numbers, not just series: on Europa's device 20480 MB booked, 22.9 GiB measured."""
    values = real_values(scraped)
    booked = scraped.prometheus.query(
        substitute('rayscope_device_vram_booked_bytes{node_id=~"$node",uuid=~"$gpu"}', values)
    )
    used = scraped.prometheus.query(
        substitute('rayscope_device_memory_used_bytes{node_id=~"$node",uuid=~"$gpu"}', values)
    )
    assert [float(s["value"][1]) for s in booked] == [20480 * 2**20]
    assert [float(s["value"][1]) for s in used] == [int(DEVICE_USED_GIB * GIB)]
    assert booked[0]["metric"]["gpu_id"] == "0" and booked[0]["metric"]["job"] == "rayscope"


def test_template_variables_list_real_values(scraped: Scraped) -> None:
    """``label_values(SELECTOR, LABEL)`` as Grafana asks it: the series API, then the label."""
    real = real_values(scraped)
    for name, definition in variable_queries().items():
        selector, label = definition[len("label_values(") : -1].rsplit(", ", 1)
        for values in (ALL, real):
            match = substitute(selector, values)
            series = scraped.prometheus.get(
                "/api/v1/series", **{"match[]": match, "start": str(time.time() - 300)}
            )
            found = {s[label] for s in series["data"] if label in s}
            assert real[name] in found, (name, match, found)


def test_live_metrics_pass_promtool_check_metrics(scraped: Scraped) -> None:
    for path in ("/metrics", "/metrics?gpus=1"):
        code, body = scraped.head.get(path)
        assert code == 200
        text = body.decode()
        done = lint(text)
        assert (done.returncode, done.stdout + done.stderr) == (0, ""), path
    # the last one linted carries the families the goldens lack: counters, per-device memory
    for family in (
        "# TYPE rayscope_gpu_xid_errors_total counter",
        "# TYPE rayscope_gpu_ecc_uncorrected_volatile_errors_total counter",
        "# TYPE rayscope_device_memory_used_bytes gauge",
        "# TYPE rayscope_pending_demands gauge",
    ):
        assert family in text


def test_without_gpus_1_the_head_serves_no_device_families(scraped: Scraped) -> None:
    """Why the scrape config asks ``?gpus=1``: the per-device panels and alerts need it; each
    answer says which it is, for the dashboard and RayscopePerDeviceMetricsMissing."""
    _, plain = scraped.head.get("/metrics")
    _, with_gpus = scraped.head.get("/metrics?gpus=1")
    assert "\nrayscope_device_" not in plain.decode() and "\nrayscope_scrape_per_device 0\n" in plain.decode()
    assert "\nrayscope_device_vram_booked_bytes{" in with_gpus.decode()
    assert "\nrayscope_scrape_per_device 1\n" in with_gpus.decode()


def test_alert_rules_load_and_judge_the_live_cluster(scraped: Scraped) -> None:
    """Prometheus loads and evaluates every rule; on the seed cluster as scraped, Europa's
    device is over its booking (22.9 GiB measured, 20480 MB booked), none is full by booking,
    the waiting replica is pending, no agent is stale."""
    prometheus = scraped.prometheus

    def evaluated() -> Optional[dict[str, dict[str, Any]]]:
        groups = prometheus.get("/api/v1/rules")["data"]["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        return rules if all(r["lastEvaluation"] != "0001-01-01T00:00:00Z" for r in rules.values()) else None

    rules = eventually(evaluated, 30, "every rule evaluated once", 0.5)
    assert len(rules) == 9 and all(r["health"] == "ok" for r in rules.values()), rules

    def fired(name: str) -> list[dict[str, str]]:
        return [s["metric"] for s in prometheus.query(rules[name]["query"])]

    over = fired("RayscopeGpuMemoryOverBooking")
    assert [(m["node_id"], m["uuid"]) for m in over] == [(scraped.cluster.node_id("head"), UUID)]
    assert fired("RayscopeGpuFullByBooking") == []
    assert fired("RayscopeAgentStale") == [] and fired("RayscopeSchedulerViewStale") == []
    assert fired("RayscopeSchedulerViewMissing") == [] and fired("RayscopeGpuLost") == []
    assert fired("RayscopePerDeviceMetricsMissing") == []  # scraped with ?gpus=1
    pending = fired("RayscopeReplicaPending")
    assert [(m["kind"], m["shape"]) for m in pending] == [("request", "GPU=0.01 VRAM_MB=8192")]
    # ECC 0, nothing pending: at most the scenario's one XID (counted before the first scrape
    # or just after it, so increase() may see it or not), never a healthy field.
    unhealthy = fired("RayscopeGpuUnhealthy")
    assert {m["problem"] for m in unhealthy} <= {"xid"}


def test_promtool_is_the_one_ci_installs() -> None:
    """``.ci/run`` installs Debian's prometheus; the rules' unit tests need its promtool."""
    done = promtool("--version")
    assert done.returncode == 0 and "promtool, version 2." in done.stdout + done.stderr
