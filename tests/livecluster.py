"""A real Ray cluster on 127.0.0.1 for the tests and ``make demo``, in a process of its own.

``python tests/livecluster.py serve --state FILE [--topology seed|demo|single]`` starts the
cluster with ``ray.cluster_utils.Cluster`` (several raylets on this host, fake GPUs declared
with ``num_gpus``), books the seed's replicas as real actors, writes FILE (GCS address,
node ids, every pid it started), then answers JSON commands on stdin — one per line,
replies on stdout prefixed with ``@@`` — until stdin closes or SIGTERM; then it shuts the
cluster down. ``python tests/livecluster.py demo`` runs the README's demo. ``--dashboard``:
with Ray's dashboard on and each node's dashboard agent reading the fake NVML (the caller
puts it on ``LD_LIBRARY_PATH``; ``--nvml-scenarios DIR`` holds a scenario per node name),
ready once the dashboard lists every node's GPUs (FILE's ``dashboard_url``).

Keeping Ray out of the pytest process keeps its process-wide state (auth mode, the
driver) from leaking between clusters, and lets a token-auth cluster run beside the main one.
Environment: the caller sets ``RAY_TMPDIR`` (short: Unix socket paths are limited) and
``RAY_AUTH_MODE``; this script sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` so Ray keeps to
127.0.0.1.
"""

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # honour 127.0.0.1 (docs/architecture.md)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

LOOPBACK = "127.0.0.1"
REPLY = "@@"

# name -> ray node args. The seed's two cases: Europa (an RTX 3090 booked by VRAM_MB) and
# deNBI (a T4 booked by GPU fraction), plus a CPU-only node.
HEAD = {"num_cpus": 8, "num_gpus": 1, "resources": {"VRAM_MB": 24576, "accelerator_type:G": 1}}
DENBI = {"num_cpus": 8, "num_gpus": 1, "resources": {"accelerator_type:T4": 1}}
CPU_ONLY = {"num_cpus": 16, "num_gpus": 0}
# Multi-GPU nodes beside the seed's head, all on the one fake NVML of this host
# (four A100s, UUIDs GPU-0000000<i>-...): a 4-GPU node as Ray sees all of them; a 2-GPU
# node whose raylet sees GPUs 1 and 3 by index (PCI bus order); a 2-GPU node whose raylet
# sees GPUs 2 and 0 by UUID. ``env`` is the raylet's environment (tests/test_live_multigpu.py).
FAKE_UUID = "GPU-{:08x}-5f1c-4d3e-9a7b-000000000000"
QUAD = {"num_cpus": 4, "num_gpus": 4, "resources": {"VRAM_MB": 4 * 40960, "accelerator_type:A100": 1}}
PAIR_BY_INDEX = {
    "num_cpus": 2,
    "num_gpus": 2,
    "resources": {"accelerator_type:A100": 1},
    "env": {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
}
PAIR_BY_UUID = {
    "num_cpus": 2,
    "num_gpus": 2,
    "resources": {"accelerator_type:V100": 1},
    "env": {"CUDA_VISIBLE_DEVICES": f"{FAKE_UUID.format(2)},{FAKE_UUID.format(0)}"},
}
# The pending-demand cases: a 2-GPU node (two 0.6 replicas leave 0.4 on each device) and a
# VRAM_MB node that two 8192 MB replicas fill.
TWO_GPUS = {"num_cpus": 4, "num_gpus": 2, "resources": {"accelerator_type:A10G": 1}}
VRAM_FULL = {"num_cpus": 4, "num_gpus": 1, "resources": {"VRAM_MB": 16384, "accelerator_type:T4": 1}}
# The label cases (Ray 2.49+): a VRAM_MB head labelled zone=a and a smaller node labelled zone=b.
ZONE_A = {"num_cpus": 2, "num_gpus": 1, "resources": {"VRAM_MB": 24576}, "labels": {"zone": "a"}}
ZONE_B = {"num_cpus": 2, "num_gpus": 1, "resources": {"VRAM_MB": 16384}, "labels": {"zone": "b"}}
TOPOLOGIES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "seed": [("head", HEAD), ("denbi", DENBI), ("cpu", CPU_ONLY)],
    "demo": [("head", HEAD), ("denbi", DENBI)],
    "single": [("head", HEAD)],
    "multigpu": [("head", HEAD), ("quad", QUAD), ("pair_index", PAIR_BY_INDEX), ("pair_uuid", PAIR_BY_UUID)],
    "pending": [("head", TWO_GPUS), ("vram", VRAM_FULL)],
    "labels": [("head", ZONE_A), ("zone_b", ZONE_B)],
}
# name -> (node, ray options): four federated-unet replicas of 5120 MB on Europa, one
# deNBI app holding a third of the T4.
SEED_ACTORS: list[tuple[str, str, dict[str, Any]]] = [
    *[
        (f"federated-unet-{i}", "head", {"num_gpus": 0.01, "num_cpus": 2, "resources": {"VRAM_MB": 5120}})
        for i in range(4)
    ],
    ("denbi-app", "denbi", {"num_gpus": 0.33, "num_cpus": 1}),
]
PENDING_ACTORS: list[tuple[str, str, dict[str, Any]]] = [
    *[(f"frag-{i}", "head", {"num_gpus": 0.6, "num_cpus": 0, "accelerator_type": "A10G"}) for i in range(2)],
    *[
        (f"vram-{i}", "vram", {"num_gpus": 0.01, "num_cpus": 0, "resources": {"VRAM_MB": 8192}})
        for i in range(2)
    ],
]
ACTORS = {"pending": PENDING_ACTORS, "labels": []}
"""The actors each topology starts with (the seed's by default)."""


def _ray_actor_states(client: Any, actor_id: str) -> str:
    """The GCS's state of one actor (``PENDING_CREATION`` while Ray cannot place it)."""
    import asyncio

    gcs_pb2: Any = importlib.import_module("ray.core.generated.gcs_pb2")

    async def fetch() -> Any:
        return await client.async_get_all_actor_info(timeout=10)

    infos = asyncio.run(fetch())
    for info in infos.values() if isinstance(infos, dict) else infos:
        if info.actor_id.hex() == actor_id:
            return str(gcs_pb2.ActorTableData.ActorState.Name(info.state))
    return "UNKNOWN"


def _node_pids(node: Any) -> list[int]:
    return [info.process.pid for infos in node.all_processes.values() for info in infos if info.process]


SCENARIO_ENV = "RAYSCOPE_FAKE_NVML_SCENARIO"
"""The fake NVML's scenario file (tests/fake_nvml): per node, the raylet's environment, so
its dashboard agent (Ray starts it from the raylet) reads that node's own GPUs."""
DASHBOARD_TIMEOUTS = {
    # Ray 2.45+ give each dashboard module process 30 s, `ray start` 60 s (2.60) for the
    # dashboard: a loaded 2-core host needs more.
    "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "300",
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "300",
}
DASHBOARD_WAIT_S = 240.0


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment for the block: what a Ray process started in it
    inherits."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _scenario_env(scenarios: Optional[str], name: str) -> dict[str, str]:
    """``RAYSCOPE_FAKE_NVML_SCENARIO`` for node ``name`` when ``scenarios/name`` exists."""
    path = os.path.join(scenarios, name) if scenarios else ""
    return {SCENARIO_ENV: path} if path and os.path.exists(path) else {}


def _tests_module(name: str) -> Any:
    """The module ``name`` of the test suite, when this file runs as a script (``make demo``,
    ``make compat``'s venvs) too."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if repo not in sys.path:
        sys.path.insert(0, repo)
    return importlib.import_module(name)


def _fake_nvml() -> Any:
    """``tests.fake_nvml``, when this file runs as a script too."""
    return _tests_module("tests.fake_nvml")


REPLICA_GIB = 4.6
"""GiB each federated-unet replica of the demo holds on Europa's RTX 3090 (it booked 5120 MB)."""
APP_GIB = 4.2
"""GiB deNBI's app holds on its T4 (it booked a third of the GPU's 15 GiB)."""


def demo_scenarios(pids: dict[str, int]) -> dict[str, str]:
    """The demo's fake GPUs, per node name, as the fake NVML reads them: Europa's RTX 3090
    (``head``), each federated-unet replica of ``pids`` (actor name -> pid) holding
    :data:`REPLICA_GIB`, and deNBI's T4 (``denbi``), its app holding :data:`APP_GIB`; with
    no pids yet, idle GPUs."""
    nvml = _fake_nvml()
    replicas = [pid for name, pid in sorted(pids.items()) if name.startswith("federated-unet")]
    apps = [pid for name, pid in pids.items() if name == "denbi-app"]
    rtx = nvml.gpu(
        0, nvml.RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=len(replicas) * REPLICA_GIB + 0.4
    )
    t4 = nvml.gpu(
        0, "Tesla T4", pci="00000000:00:1E.0", total_gib=15, used_gib=len(apps) * APP_GIB + 0.3, uuid_of=1
    )  # another GPU than Europa's
    head = rtx + "".join(nvml.process("gpu0", pid, REPLICA_GIB) for pid in replicas)
    denbi = t4 + "".join(nvml.process("gpu0", pid, APP_GIB) for pid in apps)
    return {name: nvml.HEADER + "count 1\n" + text for name, text in (("head", head), ("denbi", denbi))}


def _free_port_for_ray() -> int:
    """A number for Ray's dashboard port (tests/support/ports.free_port_for_ray says why Ray's
    ports are the one place a port is still probed)."""
    return int(_tests_module("tests.support.ports").free_port_for_ray())


class LiveCluster:
    """The cluster, its named nodes and the actors booked on them (this process is the driver).

    ``dashboard``: the head runs Ray's dashboard on 127.0.0.1 (``ray[default]`` needed) and
    every node its dashboard agent, each reading the fake NVML (``LD_LIBRARY_PATH``, set by
    the caller) with the scenario ``scenarios/<node name>`` where one exists."""

    def __init__(self, topology: str, dashboard: bool = False, scenarios: Optional[str] = None) -> None:
        # Imported as Any: this harness drives Ray's test utilities, which ray's stubs omit.
        ray: Any = importlib.import_module("ray")
        cluster_class: Any = importlib.import_module("ray.cluster_utils").Cluster

        self.ray = ray
        temp_dir = os.path.join(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), "ray")
        os.makedirs(temp_dir, exist_ok=True)
        common = {"node_ip_address": LOOPBACK, "temp_dir": temp_dir, "dashboard_agent_listen_port": None}
        spec = TOPOLOGIES[topology]
        head_name, head_args = spec[0]
        shown: dict[str, Any] = {"include_dashboard": False}
        if dashboard:
            if importlib.util.find_spec("aiohttp") is None:
                raise RuntimeError(f"no Ray dashboard under {sys.executable}: install ray[default] there")
            for key, value in DASHBOARD_TIMEOUTS.items():
                os.environ.setdefault(key, value)
            port = _free_port_for_ray()
            shown = {"include_dashboard": True, "dashboard_host": LOOPBACK, "dashboard_port": port}
        with _environ(_scenario_env(scenarios, head_name)):
            self.cluster = cluster_class(
                initialize_head=True,
                head_node_args={**common, **shown, **head_args},
            )
        self.nodes: dict[str, Any] = {head_name: self.cluster.head_node}
        for name, args in spec[1:]:
            env = {**(args or {}).get("env", {}), **_scenario_env(scenarios, name)}
            self.nodes[name] = self._add_node(common, {**(args or {}), "env": env})
        self.cluster.wait_for_nodes()
        self.dashboard_url: Optional[str] = None
        ray.init(address=self.cluster.address, log_to_driver=False, logging_level="ERROR")
        self.actors: dict[str, Any] = {}
        self.squatters: dict[str, Any] = {}  # name -> (stop event, thread, handles created)
        self.waiting: dict[str, Any] = {}
        self.groups: dict[str, Any] = {}
        self.temp_dir = temp_dir

    def _add_node(self, common: dict[str, Any], args: dict[str, Any]) -> Any:
        """A raylet started with ``args["env"]`` in its environment (its workers inherit it)."""
        with _environ(args.get("env", {})):
            return self.cluster.add_node(**common, **{k: v for k, v in args.items() if k != "env"})

    def place(self, name: str, node: str, options: dict[str, Any], class_name: str = "") -> dict[str, Any]:
        """A real actor pinned to ``node``; returns its pid, actor id and ``ray.get_gpu_ids()``
        (what the actor itself sees: the truth for per-device booking) once it runs.
        ``class_name``: the class as the actor table names it (Ray Serve names its replicas'
        class ``ServeReplica:<app>:<deployment>`` the same way, with ``type()``)."""
        strategies: Any = importlib.import_module("ray.util.scheduling_strategies")
        ray = self.ray

        class Replica:
            def pid(self) -> int:
                return os.getpid()

            def gpu_ids(self) -> list[str]:
                return [str(i) for i in ray.get_gpu_ids()]

        cls = type(class_name, (Replica,), {}) if class_name else Replica
        remote_replica: Any = self.ray.remote(cls)
        strategy = strategies.NodeAffinitySchedulingStrategy(self.nodes[node].node_id, soft=False)
        actor = remote_replica.options(name=name, scheduling_strategy=strategy, **options).remote()
        pid = self.ray.get(actor.pid.remote(), timeout=60)
        gpu_ids = self.ray.get(actor.gpu_ids.remote(), timeout=60)
        self.actors[name] = (actor, node, options)
        self.settle()
        return {"name": name, "node": node, "pid": pid, "actor_id": actor._actor_id.hex(), "gpu_ids": gpu_ids}

    def try_place(self, name: str, node: str, options: dict[str, Any], wait_s: float) -> dict[str, Any]:
        """An actor pinned to ``node`` that may never be scheduled: whether it started within
        ``wait_s`` and the GCS's state of it; killed again either way."""
        strategies: Any = importlib.import_module("ray.util.scheduling_strategies")

        class Probe:
            def ready(self) -> bool:
                return True

        remote_probe: Any = self.ray.remote(Probe)
        strategy = strategies.NodeAffinitySchedulingStrategy(self.nodes[node].node_id, soft=False)
        actor = remote_probe.options(name=name, scheduling_strategy=strategy, **options).remote()
        ready, _ = self.ray.wait([actor.ready.remote()], timeout=wait_s)
        from rayscope.sources.gcs import read as gcs_read

        client = gcs_read.connect(self.cluster.address)
        states = _ray_actor_states(client, actor._actor_id.hex())
        self.ray.kill(actor)
        return {"name": name, "started": bool(ready), "gcs_state": states}

    def submit(self, name: str, options: dict[str, Any], placement_group: str = "") -> dict[str, Any]:
        """An actor created and not waited for (it may never be placed: the pending cases),
        in the named placement group if one is given."""
        strategies: Any = importlib.import_module("ray.util.scheduling_strategies")

        class Replica:
            def pid(self) -> int:
                return os.getpid()

        if placement_group:
            group = self.groups[placement_group]
            options = {**options, "scheduling_strategy": strategies.PlacementGroupSchedulingStrategy(group)}
        actor = self.ray.remote(Replica).options(name=name, **options).remote()
        self.waiting[name] = actor
        return {"name": name, "actor_id": actor._actor_id.hex()}

    def placement_group(
        self, name: str, bundles: list[dict[str, float]], strategy: str, selectors: Optional[list[Any]] = None
    ) -> dict[str, Any]:
        """A placement group created and not waited for (``selectors``: its
        ``bundle_label_selector``, one per bundle)."""
        util: Any = importlib.import_module("ray.util.placement_group")
        labelled = {"bundle_label_selector": selectors} if selectors else {}
        group = util.placement_group(bundles, strategy=strategy, name=name, **labelled)
        self.groups[name] = group
        return {"name": name, "placement_group_id": group.id.hex()}

    def kill(self, name: str) -> dict[str, Any]:
        if name in self.waiting:  # never placed: nothing booked to settle
            self.ray.kill(self.waiting.pop(name))
            return {"name": name}
        self.ray.kill(self.actors.pop(name)[0])
        self.settle()
        return {"name": name}

    def _expected_use(self) -> dict[str, dict[str, float]]:
        use: dict[str, dict[str, float]] = {n.node_id: {} for n in self.nodes.values()}
        for _, node, options in self.actors.values():
            booked = use[self.nodes[node].node_id]
            requests = {"CPU": options.get("num_cpus", 0), "GPU": options.get("num_gpus", 0)}
            for resource, amount in {**requests, **options.get("resources", {})}.items():
                booked[resource] = booked.get(resource, 0) + amount
        return use

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until the GCS's view shows every booking: raylets report their availability
        to the GCS asynchronously, so a running actor is not yet a booked resource there.
        Read the way rayscope reads it (gcs_read: the autoscaler's resource state), not
        through ray.state, whose view can be ahead of it."""
        from rayscope.sources.gcs import read as gcs_read

        client = gcs_read.connect(self.cluster.address)
        expected = self._expected_use()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = {n["node_id"]: n for n in gcs_read.read_nodes(client, 5.0)}
            if all(
                node_id in nodes
                and abs(
                    nodes[node_id]["total"].get(r, 0) - (nodes[node_id]["available"] or {}).get(r, 0) - amount
                )
                < 1e-4
                for node_id, booked in expected.items()
                for r, amount in booked.items()
            ):
                return
            time.sleep(0.1)
        raise TimeoutError(f"the GCS never showed the bookings {expected}")

    TOPOLOGY_OPS = (
        "add_node", "remove_node", "named_actors", "probe_named", "actor_table_hex", "kill_named",
        "squat", "unsquat", "api_in_actor",
    )  # fmt: skip
    """Commands named after the method that answers them (node agents placed through Ray)."""

    def add_node(self, name: str, args: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """One more raylet on this host (``add_node``); its node id once the GCS has it."""
        common = {"node_ip_address": LOOPBACK, "temp_dir": self.temp_dir, "dashboard_agent_listen_port": None}
        self.nodes[name] = self.cluster.add_node(**common, **(args or {}))
        self.cluster.wait_for_nodes()
        return {"name": name, "node_id": self.nodes[name].node_id}

    def remove_node(self, name: str) -> dict[str, Any]:
        node = self.nodes.pop(name)
        self.cluster.remove_node(node)
        return {"name": name, "node_id": node.node_id}

    def named_actors(self) -> dict[str, Any]:
        """Every named actor the GCS lists (not DEAD), in every namespace."""
        return {"actors": self.ray.util.list_named_actors(all_namespaces=True)}

    def api_in_actor(self) -> dict[str, Any]:
        """rayscope's Python API called inside a Ray actor on the head, as BioEngine's cluster
        actor would call it: what it answered, and what it wrote to the actor's stdout/stderr."""
        strategies: Any = importlib.import_module("ray.util.scheduling_strategies")

        class ApiCaller:
            def ask(self, gcs: str) -> dict[str, Any]:
                import contextlib
                import io

                import rayscope

                said = io.StringIO()
                with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
                    state = rayscope.cluster_state(gcs=gcs, timeout=60.0)
                    answer = rayscope.fit(gpu_memory_mb=4096, gcs=gcs, timeout=60.0)
                return {"state": state, "fit": answer, "printed": said.getvalue()}

        strategy = strategies.NodeAffinitySchedulingStrategy(self.nodes["head"].node_id, soft=False)
        actor = self.ray.remote(ApiCaller).options(num_cpus=0, scheduling_strategy=strategy).remote()
        try:
            reply: dict[str, Any] = self.ray.get(actor.ask.remote(self.cluster.address), timeout=120)
        finally:
            self.ray.kill(actor)
        return reply

    def kill_named(self, name: str, namespace: str) -> dict[str, Any]:
        self.ray.kill(self.ray.get_actor(name, namespace=namespace), no_restart=True)
        return {"name": name}

    def squat(self, name: str, namespace: str, node: str) -> dict[str, Any]:
        """A Ray user's loop that keeps an actor of its own named ``name`` in ``namespace``
        on ``node``: created again within 0.2 s whenever the name is free (until ``unsquat``)."""
        import threading

        strategies: Any = importlib.import_module("ray.util.scheduling_strategies")
        strategy = strategies.NodeAffinitySchedulingStrategy(self.nodes[node].node_id, soft=False)

        class Squatter:
            def ready(self) -> bool:
                return True

        remote: Any = self.ray.remote(Squatter).options(
            name=name, namespace=namespace, num_cpus=0, scheduling_strategy=strategy
        )
        stop = threading.Event()
        created: list[Any] = []  # the handles: an actor whose handles are all gone is destroyed

        def loop() -> None:
            while not stop.is_set():
                try:
                    self.ray.get_actor(name, namespace=namespace)
                except ValueError:  # free: take it
                    with contextlib.suppress(ValueError):  # taken in between
                        created.append(remote.remote())
                stop.wait(0.2)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        self.squatters[name] = (stop, thread, created)
        return {"name": name}

    def unsquat(self, name: str, namespace: str) -> dict[str, Any]:
        """Stop ``squat``'s loop and kill what holds the name; how many actors it created."""
        stop, thread, created = self.squatters.pop(name)
        stop.set()
        thread.join(timeout=10)
        with contextlib.suppress(ValueError):
            self.ray.kill(self.ray.get_actor(name, namespace=namespace), no_restart=True)
        return {"name": name, "created": len(created)}

    def probe_named(self, name: str, namespace: str) -> dict[str, Any]:
        """An actor's own ``probe()`` answer (rayscope's node agents have one)."""
        return {
            "probe": self.ray.get(self.ray.get_actor(name, namespace=namespace).probe.remote(), timeout=60)
        }

    def actor_table_hex(self) -> dict[str, Any]:
        """Every entry of the GCS actor table, dead ones included, as serialized protobufs:
        all that ``ray list actors --detail`` and the dashboard can show of an actor."""
        from rayscope.sources.gcs import read as gcs_read

        client = gcs_read.connect(self.cluster.address)

        async def fetch() -> Any:
            return await client.async_get_all_actor_info(timeout=10)

        import asyncio

        infos = asyncio.run(fetch())
        entries = list(infos.values()) if isinstance(infos, dict) else list(infos)
        return {"actors": [info.SerializeToString().hex() for info in entries]}

    def wait_dashboard(self, timeout_s: float = DASHBOARD_WAIT_S) -> str:
        """The address the dashboard published in the GCS, once its node summary lists every
        node's GPUs (each node's agent has reported once: Ray's agents report every 5 s)."""
        from rayscope.sources.gcs import raycompat
        from rayscope.sources.gcs import read as gcs_read

        client = gcs_read.connect(self.cluster.address)
        expected = {node.node_id for node in self.nodes.values()}
        deadline = time.monotonic() + timeout_s
        seen: Any = "nothing"
        while time.monotonic() < deadline:
            url, _ = raycompat.dashboard_url(client, 5.0)
            if url:
                request = urllib.request.Request(f"http://{url}/nodes?view=summary")
                request.add_header("User-Agent", "rayscope-tests")  # Ray 2.33-2.44 need one
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        seen = json.loads(response.read())["data"]["summary"]
                except (OSError, ValueError, KeyError) as err:
                    seen = f"{type(err).__name__}: {err}"
                reported = (
                    {n["raylet"]["nodeId"] for n in seen if "gpus" in n} if isinstance(seen, list) else set()
                )
                if reported >= expected:
                    self.dashboard_url = url
                    return url
            time.sleep(0.5)
        raise TimeoutError(f"the dashboard never listed every node's GPUs: {str(seen)[:300]}")

    def state(self) -> dict[str, Any]:
        nodes = {
            name: {"node_id": n.node_id, "raylet_pid": n.all_processes["raylet"][0].process.pid}
            for name, n in self.nodes.items()
        }
        pids = sorted({pid for n in self.nodes.values() for pid in _node_pids(n)})
        return {
            "gcs_address": self.cluster.address,
            "temp_dir": self.temp_dir,
            "launcher_pid": os.getpid(),
            "python": sys.executable,
            "nodes": nodes,
            "pids": pids,
            "dashboard_url": self.dashboard_url,
        }

    def shutdown(self) -> None:
        self.ray.shutdown()
        self.cluster.shutdown()


class Stopped(Exception):
    """SIGTERM: leave the command loop and shut the cluster down."""


def serve(args: argparse.Namespace) -> int:
    cluster = LiveCluster(args.topology, args.dashboard, args.nvml_scenarios)

    def on_sigterm(*_: object) -> None:
        # Raise, do not close stdin: closing it under a read in progress raised "reentrant
        # call inside BufferedReader". One stop only: the shutdown below is not interrupted.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        actors = ACTORS.get(args.topology, SEED_ACTORS)
        placed = [cluster.place(*actor) for actor in actors if actor[1] in cluster.nodes]
        if args.dashboard:
            cluster.wait_dashboard()
        state = {**cluster.state(), "actors": placed}
        tmp = args.state + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, args.state)
        print(f"{REPLY}{json.dumps({'ok': True, 'ready': True})}", flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            try:
                out = {"ok": True, **answer(cluster, request)}
            except Exception as err:  # reported to the test, which decides
                out = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            print(f"{REPLY}{json.dumps(out)}", flush=True)
    except Stopped:
        pass
    finally:
        cluster.shutdown()
    return 0


def answer(cluster: LiveCluster, request: dict[str, Any]) -> dict[str, Any]:
    """One command of the loop on stdin (``op`` and its arguments) answered on ``cluster``."""
    op = request.pop("op")
    if op == "actor":
        reply = cluster.place(
            request["name"],
            request["node"],
            request.get("options", {}),
            request.get("class_name", ""),
        )
    elif op == "try_actor":
        reply = cluster.try_place(
            request["name"],
            request["node"],
            request.get("options", {}),
            request.get("wait_s", 10.0),
        )
    elif op == "kill_actor":
        reply = cluster.kill(request["name"])
    elif op == "submit":
        reply = cluster.submit(
            request["name"], request.get("options", {}), request.get("placement_group", "")
        )
    elif op == "placement_group":
        reply = cluster.placement_group(
            request["name"], request["bundles"], request["strategy"], request.get("selectors")
        )
    elif op in LiveCluster.TOPOLOGY_OPS:  # the request's other keys are the arguments
        reply = getattr(cluster, op)(**request)
    else:
        reply = {"state": cluster.state()}
    return reply


def demo_gpus(root: str) -> tuple[list[str], dict[str, str], dict[str, str], str]:
    """What the demo's GPUs need: (``serve``'s options, the environment of Ray's processes,
    rayscope's own environment, a line to say when something is missing). The fake NVML
    (built with ``cc``) under every raylet, each node reading its own scenario, and Ray's
    dashboard on where ``ray[default]`` is installed: its agents measure every node's GPU.
    rayscope reads the head's scenario too, as it reads the real NVML of the host it runs on."""
    nvml = _fake_nvml()
    try:
        (Path(root) / "nvml-lib").mkdir()
        lib = nvml.build(Path(root) / "nvml-lib")
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        return [], {}, {}, f"(no fake NVML: {err}; every VRAM: reads NA)"
    scenarios = Path(root) / "nvml"
    scenarios.mkdir()
    for name, text in demo_scenarios({}).items():
        nvml.write_scenario(scenarios / name, text)
    ray_env = {"LD_LIBRARY_PATH": str(lib.lib_dir)}
    own_env = {**ray_env, SCENARIO_ENV: str(scenarios / "head")}
    options = ["--nvml-scenarios", str(scenarios)]
    if importlib.util.find_spec("aiohttp") is None:
        return options, ray_env, own_env, "(ray without [default]: no dashboard, the worker's VRAM: reads NA)"
    return ["--dashboard", *options], ray_env, own_env, ""


def hold_demo_memory(state: dict[str, Any], root: str, timeout_s: float = 60.0) -> None:
    """Each demo replica holds its GPU memory (the scenarios rewritten with the actors' pids),
    and, with the dashboard on, wait until it shows every node's processes (its agents sample
    every 5 s)."""
    scenarios = Path(root) / "nvml"
    if not scenarios.is_dir():
        return
    pids = {a["name"]: a["pid"] for a in state.get("actors", [])}
    nvml = _fake_nvml()
    for name, text in demo_scenarios(pids).items():
        nvml.write_scenario(scenarios / name, text)
    url = state.get("dashboard_url")
    deadline = time.monotonic() + timeout_s
    while url and time.monotonic() < deadline:
        request = urllib.request.Request(f"http://{url}/nodes?view=summary")
        request.add_header("User-Agent", "rayscope-demo")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                summary = json.loads(response.read())["data"]["summary"]
        except (OSError, ValueError, KeyError):
            summary = []
        listed = {p["pid"] for n in summary for g in n.get("gpus", []) for p in g.get("processesPids") or []}
        if listed >= set(pids.values()):
            return
        time.sleep(0.5)


def demo(keep: bool = False) -> int:
    """``make demo``: a two-node cluster, the seed's bookings, rayscope's answer, then stop;
    ``keep`` (``make demo KEEP=1``): the cluster stays up until Ctrl-C, and the commands to try
    against it are printed (a token file for the agents included). Every raylet runs on the
    fake NVML with Ray's dashboard on (:func:`demo_gpus`), so every node's VRAM is measured."""
    root = tempfile.mkdtemp(prefix="rs-demo-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": root, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    state_file = os.path.join(root, "state.json")
    options, ray_env, own_env, missing = demo_gpus(root)
    print(
        f"Starting a Ray cluster on {LOOPBACK} (head with VRAM_MB 24576 + one worker, fake GPUs) ...",
        flush=True,
    )
    launcher = subprocess.Popen(
        [sys.executable, __file__, "serve", "--state", state_file, "--topology", "demo", *options],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**env, **ray_env},
        text=True,
        start_new_session=True,  # Ctrl-C reaches the demo, which stops the cluster in order
    )
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:
            if line.startswith(REPLY):
                break
        with open(state_file) as f:
            state = json.load(f)
        hold_demo_memory(state, root)
        print("Booked four federated-unet replicas (num_gpus=0.01, VRAM_MB=5120)")
        print("and one deNBI app (num_gpus=0.33) as real actors.")
        if missing:
            print(missing)
        env = {**env, **own_env}
        rayscope = [sys.executable, "-m", "rayscope"]
        gcs = ["--gcs", state["gcs_address"]]
        print(f"\n$ rayscope status --gcs {state['gcs_address']}", flush=True)
        subprocess.run([*rayscope, "status", *gcs], env=env, check=True, timeout=60)
        out = subprocess.run(
            [*rayscope, "status", "--json", *gcs],
            env=env,
            check=True,
            timeout=60,
            capture_output=True,
            text=True,
        ).stdout
        print(f"\n$ rayscope status --json --gcs {state['gcs_address']}  # the cluster block")
        print(json.dumps(json.loads(out)["cluster"], indent=2))
        if keep:
            # Ctrl-C, or SIGTERM, even where SIGINT came ignored (a job started with `&`).
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.default_int_handler)
            print(commands_to_try(state, root, own_env), flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        print("\nStopping the cluster ...", flush=True)
        if launcher.stdin:
            launcher.stdin.close()
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _own_gpus(root: str, name: str) -> str:
    """``RAYSCOPE_FAKE_NVML_SCENARIO=... `` for node ``name``'s commands, where the demo has
    a scenario for it (each node's agent reads its own GPUs); ``""`` otherwise."""
    scenario = Path(root) / "nvml" / name
    return f"{SCENARIO_ENV}={scenario} " if scenario.exists() else ""


def commands_to_try(state: dict[str, Any], root: str, own_env: Optional[dict[str, str]] = None) -> str:
    """What ``make demo KEEP=1`` prints: commands to paste into another terminal, as they are.
    The agents get a token file of their own; both raylets run on this host, so each
    ``push`` names its node (``--node-id``) and reads that node's own fake GPUs (its
    scenario before the command: the ``export`` line's is the head's, which ``status``,
    ``fit`` and ``node`` read as this host's)."""
    token = os.path.join(root, "token")
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    gcs = state["gcs_address"]
    bin_dir = os.path.dirname(sys.executable)
    nodes = state["nodes"]
    lines = [
        "",
        "The cluster stays up until Ctrl-C. In another terminal, try:",
        "",
        f"  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_TMPDIR={root} PATH={bin_dir}:$PATH"
        + "".join(f" {k}={v}" for k, v in sorted((own_env or {}).items())),
        f"  rayscope status --gcs {gcs}",
        f"  rayscope status --gcs {gcs} --gpus",
        f"  rayscope status --gcs {gcs} --watch",
        f"  rayscope fit --gcs {gcs} --gpu-memory-mb 4096",
        f"  rayscope fit --gcs {gcs} --gpu-memory-mb 5120",
        f"  rayscope node --gcs {gcs}",
        "",
        "The agents (each in a terminal of its own; Ctrl-C stops one):",
        "",
        f"  rayscope head --gcs {gcs} --token-file {token} --interval 2",
        *(
            f"  {_own_gpus(root, name)}rayscope push --head 127.0.0.1:7531 --token-file {token} --interval 2"
            f" --node-id {n['node_id']}"
            for name, n in nodes.items()
        ),
        f"  rayscope status --head http://127.0.0.1:7532 --token-file {token}",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("--state", required=True)
    serve_parser.add_argument("--topology", choices=sorted(TOPOLOGIES), default="seed")
    serve_parser.add_argument("--dashboard", action="store_true", help="run Ray's dashboard (ray[default])")
    serve_parser.add_argument(
        "--nvml-scenarios", help="a directory of fake NVML scenarios, one per node name"
    )
    demo_parser = sub.add_parser("demo")
    demo_parser.add_argument("--keep", action="store_true", help="keep the cluster up until Ctrl-C")
    args = parser.parse_args()
    if args.command == "serve":
        return serve(args)
    return demo(keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())


def open_url(url: str, data: Optional[bytes] = None, **headers: str) -> tuple[int, dict[str, str], bytes]:
    """One request (the tests' own client, not rayscope's), redirects not followed: status,
    headers, body; an HTTP error status is an answer, not an exception."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with opener.open(req, timeout=10) as response:
            return int(response.status), dict(response.headers), bytes(response.read())
    except urllib.error.HTTPError as err:
        with err:  # its response holds the socket: closed, not left to the collector
            return int(err.code), dict(err.headers), bytes(err.read())
