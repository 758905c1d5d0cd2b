"""Read every node's resources from a Ray GCS without ``ray.init()``: no driver, no job.

Standalone on purpose — the standard library, ``ray`` and ``raycompat`` only — so the same
file also runs as a script under the Ray node's own Python when the interpreter running
rayscope cannot import ray (``gcs.py`` runs ``raycompat`` and this file joined as one
script: ``ADDRESS TIMEOUT`` prints one JSON document; ``ADDRESS TIMEOUT actors`` adds the
live actors, ``pending`` what waits to be placed: see :func:`read_pending`; every answer
carries the address the cluster's dashboard published, ``dashboard_url``). Differences
between Ray releases live in ``raycompat`` only.

Output, per node: ``node_id`` (hex), ``node_ip``, ``hostname``, ``is_head``, ``alive``,
``total``, ``available`` (``null`` when the GCS holds none, e.g. for a dead node), ``labels``.
Per live actor (and per recently dead one, ``state`` ``DEAD``): ``actor_id``, ``node_id``,
``pid``, ``name``, ``class_name``, ``state``,
``job_id`` (hex), ``required`` (resources it booked), ``gpu_ids`` (the GPU ids Ray gave it),
``gpu_shares`` (``[[gpu_id, quantity], ...]``: how much of each of those GPUs it holds, from
the actor table's ``resource_mapping``; Ray gives a fraction on one device, whole GPUs as 1.0
each).
"""

import importlib
import json
import os
import sys
from collections.abc import MutableMapping
from typing import Any, Optional

if __name__ == "__main__":  # script mode: gcs.py put raycompat's source above this one
    raycompat: Any = sys.modules[__name__]
else:
    from rayscope.sources.gcs import raycompat

AUTH_MODE = "RAY_AUTH_MODE"
DEFAULT_TOKEN_PATH = os.path.join("~", ".ray", "auth_token")


def prepare_auth_env(environ: MutableMapping[str, str]) -> Optional[str]:
    """Turn Ray token auth on the way ``ray start`` does, before ray is imported.

    ``ray start`` enables token auth by itself when ``RAY_AUTH_MODE`` is unset and a token
    exists (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``); a client
    must do the same or the GCS refuses it. Returns where the token comes from, if any.
    """
    if environ.get("RAY_AUTH_TOKEN"):
        source = "RAY_AUTH_TOKEN"
    elif environ.get("RAY_AUTH_TOKEN_PATH"):
        source = "RAY_AUTH_TOKEN_PATH"
    elif os.path.exists(os.path.expanduser(DEFAULT_TOKEN_PATH)):
        source = DEFAULT_TOKEN_PATH
    else:
        return None
    environ.setdefault(AUTH_MODE, "token")
    return source


def _ray(module: str) -> Any:
    """A ray module, imported on first use (ray's own stubs do not cover these names)."""
    return importlib.import_module(module)


def connect(address: str) -> Any:
    """A GCS client. Blocks ~40 s on an unreachable address: callers run it under a deadline."""
    return _ray("ray._raylet").GcsClient(address=address)


def _resources(entries: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in dict(entries).items()}


def resource_state(client: Any, timeout_s: float) -> Any:
    """The autoscaler's state (``ClusterResourceState``): per node total and available, and
    what waits. One read serves :func:`read_nodes` and :func:`read_pending` alike."""
    reply = _ray("ray.core.generated.autoscaler_pb2").GetClusterResourceStateReply()
    reply.ParseFromString(client.get_cluster_resource_state(timeout_s=timeout_s))
    return reply.cluster_resource_state


def read_nodes(client: Any, timeout_s: float, state: Any = None) -> list[dict[str, Any]]:
    """Every node the GCS knows, alive or dead, as plain JSON-ready dicts. ``state``: the
    :func:`resource_state` already read (else it is read here, after the node table)."""
    alive_state = _ray("ray.core.generated.gcs_pb2").GcsNodeInfo.GcsNodeState.ALIVE
    infos = client.get_all_node_info(timeout=timeout_s)
    # Ray 2.x returns {NodeID: GcsNodeInfo}; some releases returned a list.
    items = list(infos.values()) if isinstance(infos, dict) else list(infos)
    cluster = state if state is not None else resource_state(client, timeout_s)
    states = {s.node_id.hex(): s for s in cluster.node_states}
    nodes = []
    for info in items:
        node_id = info.node_id.hex()
        alive = info.state == alive_state
        state = states.get(node_id)
        labels = raycompat.node_labels(info, state)
        nodes.append(
            {
                "node_id": node_id,
                "node_ip": info.node_manager_address,
                "hostname": info.node_manager_hostname,
                "is_head": bool(info.is_head_node),
                "alive": alive,
                "total": _resources(state.total_resources if state is not None else info.resources_total),
                "available": _resources(state.available_resources) if state is not None and alive else None,
                "labels": labels,
            }
        )
    return nodes


MAX_DEAD_ACTORS = 1000
"""The dead actors kept from the GCS's table (the most recently dead first): enough to name
the worker of an actor that died and left GPU memory held; Ray keeps up to 100,000."""


def _dead_actors(client: Any, address: str, timeout_s: float) -> list[Any]:
    """The :data:`MAX_DEAD_ACTORS` most recently dead actors that ran in a worker; none when
    the table does not answer (their leaked memory is then not named, never misread)."""
    try:
        infos = raycompat.actor_table(client, address, timeout_s, "DEAD")
    except Exception:
        return []
    ran = [info for info in infos if int(info.pid)]
    ran.sort(key=lambda info: -int(getattr(info, "end_time", 0) or 0))
    return ran[:MAX_DEAD_ACTORS]


def read_actors(
    client: Any, address: str, timeout_s: float, alive: Optional[list[Any]] = None
) -> list[dict[str, Any]]:
    """Every live actor: what it booked and where it runs, as plain JSON-ready dicts; then
    the most recently dead ones (``state`` ``DEAD``: whose worker may still hold GPU memory).
    ``alive``: the live actor table already read (else it is read here)."""
    states = _ray("ray.core.generated.gcs_pb2").ActorTableData.ActorState
    actors = []
    infos = alive if alive is not None else raycompat.actor_table(client, address, timeout_s)
    for info in [*infos, *_dead_actors(client, address, timeout_s)]:
        node_id = info.node_id or info.address.node_id
        shares: dict[int, float] = {}
        for entry in info.resource_mapping:
            if entry.name == "GPU":
                for r in entry.resource_ids:
                    shares[int(r.index)] = shares.get(int(r.index), 0.0) + float(r.quantity)
        actors.append(
            {
                "actor_id": info.actor_id.hex(),
                "node_id": node_id.hex(),
                "pid": int(info.pid) or None,
                "name": info.name,
                "class_name": info.class_name,
                "state": states.Name(info.state),
                "job_id": info.job_id.hex(),
                "required": _resources(info.required_resources),
                "gpu_ids": sorted(shares),
                "gpu_shares": [[gpu_id, round(shares[gpu_id], 4)] for gpu_id in sorted(shares)],
            }
        )
    return actors


PENDING_ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")
"""Actor table states of an actor that holds no resources yet: it waits to be placed."""


def _device_use(infos: list[Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per node, per resource, per device index: what the live actors hold
    (``resource_mapping``: Ray's own per-device placement, e.g. ``GPU [(1, 0.6)]``)."""
    use: dict[str, dict[str, dict[str, float]]] = {}
    for info in infos:
        node_id = (info.node_id or info.address.node_id).hex()
        for mapping in info.resource_mapping:
            per_device = use.setdefault(node_id, {}).setdefault(str(mapping.name), {})
            for rid in mapping.resource_ids:
                key = str(int(rid.index))
                per_device[key] = per_device.get(key, 0.0) + float(rid.quantity)
    return use


def _waiting_actor(info: Any, states: Any) -> dict[str, Any]:
    """One actor not placed yet (an ``ActorTableData``), as ``PendingActor`` reads it."""
    actor = {
        "actor_id": info.actor_id.hex(),
        "name": info.name,
        "class_name": info.class_name,
        "state": states.Name(info.state),
        "job_id": info.job_id.hex(),
        "required_resources": _resources(info.required_resources),
        "placement_group_id": info.placement_group_id.hex(),
    }
    selector = raycompat.actor_selector(info)
    if selector:
        actor["label_selector"] = selector
    return actor


def read_pending(
    client: Any,
    address: str,
    timeout_s: float,
    state: Any = None,
    alive: Optional[list[Any]] = None,
    labels: Optional[dict[str, dict[str, str]]] = None,
) -> dict[str, Any]:
    """What waits to be placed, and what the scheduler has free, from one autoscaler-state
    read (the same call ``ray status`` makes; ``state`` when already read) plus the actor
    table, as plain JSON-ready dicts. The live actors (``alive`` when already read) only
    when something waits: their per-device use judges only a waiting shape.

    ``requests``: the pending resource requests (tasks and actors), each ``shape`` (Ray's
    names, placement-group resources as Ray writes them: ``GPU_group_<pg id>``) and
    ``count``; ``gangs``: the pending placement groups, each ``bundles`` and ``details``
    (``<pg id>:<strategy>|<state>``); ``nodes``: per alive node ``node_id``, ``node_ip``,
    ``total``, ``available``; ``actors``: the actors not placed yet (``name``, ``job_id``,
    ``state``, ``required_resources``, ``placement_group_id``, ``label_selector``); ``device_use``:
    per node, resource and device index, what the live actors hold. Label selectors where
    this Ray has them (``raycompat``): each request's ``label_selectors``, each group's
    ``bundle_selectors``, each waiting actor's fallbacks (``actor_fallbacks``); each node's
    ``labels`` (``labels``: node id → labels, as :func:`read_nodes` read them; else from
    ``state``).
    """
    state = state if state is not None else resource_state(client, timeout_s)
    dead = _ray("ray.core.generated.autoscaler_pb2").NodeStatus.Value("DEAD")
    nodes = [
        {
            "node_id": s.node_id.hex(),
            "node_ip": s.node_ip_address,
            "total": _resources(s.total_resources),
            "available": _resources(s.available_resources),
            "labels": (labels or {}).get(s.node_id.hex()) or raycompat.node_labels(None, s),
        }
        for s in state.node_states
        if s.status != dead
    ]
    requests = [
        {
            "shape": _resources(r.request.resources_bundle),
            "count": int(r.count),
            "label_selectors": raycompat.request_selectors(r.request),
        }
        for r in state.pending_resource_requests
    ]
    # Older releases have no gang requests in this reply: then none are reported, not an error.
    gangs = [
        {
            "bundles": [_resources(b.resources_bundle) for b in g.requests],
            "details": str(g.details),
            "bundle_selectors": raycompat.gang_selectors(g),
        }
        for g in getattr(state, "pending_gang_resource_requests", [])
    ]
    states = _ray("ray.core.generated.gcs_pb2").ActorTableData.ActorState
    waiting = [
        info
        for table in raycompat.actor_tables(client, address, timeout_s, PENDING_ACTOR_STATES)
        for info in table
    ]
    actors = [_waiting_actor(info, states) for info in waiting]
    fallbacks = {info.actor_id.hex(): raycompat.actor_fallbacks(info) for info in waiting}
    waits = requests or gangs or actors
    if waits and alive is None:
        alive = raycompat.actor_table(client, address, timeout_s)
    return {
        "nodes": nodes,
        "requests": requests,
        "gangs": gangs,
        "actors": actors,
        "device_use": _device_use(alive) if waits and alive is not None else {},
        "actor_fallbacks": {actor: chosen for actor, chosen in fallbacks.items() if chosen},
    }


def ray_version() -> str:
    return str(_ray("ray").__version__)


IMPORTED = "rayscope: ray imported"
"""Written to stderr once ``import ray`` is done: a parent that kills this script at its
deadline tells a slow import from a GCS that did not answer."""


DASHBOARD_MARK = "rayscope: dashboard "
"""Written to stderr, then the dashboard's published address as JSON (``null`` when none), as
soon as the KV answered: the same text as the answer's ``dashboard_url``, early."""


class _RetryWhole(Exception):
    """A light import's symptom during a read (see :func:`raycompat.import_raylet`)."""


def _read(words: list[str], light: bool) -> dict[str, Any]:
    """``ADDRESS TIMEOUT_S [actors] [pending]``: the answer :func:`main` prints."""
    address, timeout_s, flags = words[0], float(words[1]), words[2:]

    def failed(err: Exception) -> str:
        if light and isinstance(err, raycompat.LIGHT_IMPORT_SYMPTOMS):
            raise _RetryWhole(f"{type(err).__name__}: {err}")
        return f"{type(err).__name__}: {err}"

    try:
        client = connect(address)
        # First, so that a parent reading stderr can start the dashboard's GET at once.
        dashboard, dashboard_error = raycompat.dashboard_url(client, timeout_s)
        print(DASHBOARD_MARK + json.dumps(dashboard), file=sys.stderr, flush=True)
        state = resource_state(client, timeout_s)
        out: dict[str, Any] = {"ok": True, "nodes": read_nodes(client, timeout_s, state)}
        out["dashboard_url"], out["dashboard_url_error"] = dashboard, dashboard_error
        out["ray_version"] = ray_version()
        out["cluster_ray_version"], out["cluster_ray_version_error"] = raycompat.cluster_ray_version(
            client, timeout_s
        )
    except Exception as err:  # reported to the parent as data, never a traceback
        return {"ok": False, "error": failed(err)}
    alive = None
    if "actors" in flags:
        try:  # the nodes stand even when the actor table does not answer
            alive = raycompat.actor_table(client, address, timeout_s)
            out["actors"] = read_actors(client, address, timeout_s, alive)
        except Exception as err:
            out["actors_error"] = failed(err)
    if "pending" in flags:
        try:  # the nodes stand even when the pending demand does not answer
            labels = {n["node_id"]: n["labels"] for n in out["nodes"]}
            out["pending"] = read_pending(client, address, timeout_s, state, alive, labels)
        except Exception as err:
            out["pending_error"] = failed(err)
    return out


def main(argv: list[str]) -> int:
    """Script mode: ``ADDRESS TIMEOUT_S [actors] [pending] [whole]`` → one JSON document on
    stdout. ``-`` instead: the same words as one JSON list on stdin, read once ray is imported
    (the CLI starts this child before it knows the address; no line: it was not needed).
    ``whole``: ``import ray`` whole, after an answer ``retry_whole`` (the light import did
    not work under this Ray)."""
    words = argv[1:]
    light = "whole" not in words
    prepare_auth_env(os.environ)
    out: dict[str, Any] = {}
    try:
        raycompat.import_raylet(light)  # the slow part on a loaded host: the parent's timeout names it
        print(IMPORTED, file=sys.stderr, flush=True)
    except raycompat.LightImportFailed as err:
        out = {"ok": False, "error": str(err), "retry_whole": True}
    except Exception as err:
        out = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    if words[:1] == ["-"]:
        line = sys.stdin.readline()
        if not line:
            return 0
        words = [str(word) for word in json.loads(line)]
    if not out:
        try:
            out = _read(words, light)
        except _RetryWhole as err:
            out = {"ok": False, "error": str(err), "retry_whole": True}
    out["python"] = sys.executable
    json.dump(out, sys.stdout)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    # The answer is written: skip the interpreter's teardown, which with Ray's client loaded
    # (its gRPC threads, its destructors) took 50-70 ms of the command on a busy host.
    os._exit(code)
