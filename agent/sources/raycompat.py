"""Every difference between the Ray releases rayscope supports (2.33-2.60), in one place.

The GCS read (``gcs_read``) and the raylet scan (``raylet``) ask this module, never Ray's
version number, how to get a fact; each function detects what the installed Ray offers and
falls back in order. What differs, by release (each wheel's API listed by introspection,
the commands run against a live cluster of 2.33.0, 2.40.0, 2.44.1 and 2.60.0 by
``make compat``):

=========================================  ==============  ==================================
what                                       changed in      how it is read here
=========================================  ==============  ==================================
``NodeState.labels`` (autoscaler state)    added 2.49      else ``dynamic_labels``; node
                                                           labels from ``GcsNodeInfo`` in all
GCS client's actor table call              added 2.35      ``async_get_all_actor_info``; before
                                                           (2.33, 2.34): GlobalStateAccessor
``GcsClient`` wraps another class          2.34 (New/Old)  only methods are looked up, never
                                           by 2.44 (Inner) the class
``GlobalStateAccessor.disconnect``         gone by 2.53    called only where it exists
cluster's Ray version                      never           KV ``cluster/CLUSTER_METADATA``
=========================================  ==============  ==================================

Standalone like ``gcs_read`` (the standard library and, lazily, ``ray``): ``gcs.py`` runs
the two joined as one script under a Ray node's own Python. A fact an old Ray cannot give is
``None`` with a reason, never an exception that fails the whole read.
"""

import glob
import importlib
import json
import os
from typing import Any, Optional

CLUSTER_METADATA_KEY = b"CLUSTER_METADATA"
"""Written by the head at ``ray start`` (Ray's usage library) into the KV namespace below,
in every supported release: ``{"ray_version": ..., "python_version": ...}``."""
CLUSTER_METADATA_NAMESPACE = b"cluster"


def _ray(module: str) -> Any:
    return importlib.import_module(module)


def _fields(message: Any) -> set[str]:
    return set(message.DESCRIPTOR.fields_by_name)


def _str_map(entries: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(entries).items()}


def node_labels(info: Any, state: Optional[Any]) -> dict[str, str]:
    """A node's labels: ``GcsNodeInfo.labels`` (every release) merged with the autoscaler
    state's ``labels`` (2.49+) or, before it had those, its ``dynamic_labels``."""
    labels = _str_map(info.labels) if "labels" in _fields(info) else {}
    if state is not None:
        for name in ("labels", "dynamic_labels"):
            if name in _fields(state):
                labels.update(_str_map(getattr(state, name)))
                break
    return labels


def actor_table(client: Any, address: str, timeout_s: float, state: str = "ALIVE") -> list[Any]:
    """The GCS actor table's entries in ``state`` (``ActorTableData``), however this Ray
    offers it:

    * a synchronous ``get_all_actor_info`` (in no release 2.33-2.60; first if one adds it);
    * ``async_get_all_actor_info`` (2.35+);
    * Ray's ``GlobalStateAccessor`` (2.33, 2.34: no actor call on their GCS client).
    """
    if hasattr(client, "get_all_actor_info"):
        infos = client.get_all_actor_info(actor_state_name=state, timeout=timeout_s)
    elif hasattr(client, "async_get_all_actor_info"):
        import asyncio  # here, not at the top: the CLI imports this module on every run

        async def fetch() -> Any:
            return await client.async_get_all_actor_info(actor_state_name=state, timeout=timeout_s)

        infos = asyncio.run(fetch())
    else:
        return _actor_table_by_accessor(address, state)
    return list(infos.values()) if isinstance(infos, dict) else list(infos)


def _actor_table_by_accessor(address: str, state: str) -> list[Any]:
    raylet = _ray("ray._raylet")
    options = raylet.GcsClientOptions.create(address, None, True, False)
    accessor = raylet.GlobalStateAccessor(options)
    accessor.connect()
    try:
        rows = accessor.get_actor_table(None, state)
    finally:
        if hasattr(accessor, "disconnect"):  # gone by 2.53
            accessor.disconnect()
    table = _ray("ray.core.generated.gcs_pb2").ActorTableData
    return [table.FromString(row) for row in rows]


def cluster_ray_version(client: Any, timeout_s: float) -> tuple[Optional[str], str]:
    """(the Ray version the cluster's head runs, ``""``) or ``(None, why not)``."""
    try:
        raw = client.internal_kv_get(CLUSTER_METADATA_KEY, CLUSTER_METADATA_NAMESPACE, timeout=timeout_s)
    except Exception as err:
        return None, f"cluster metadata not readable: {type(err).__name__}: {err}"
    if not raw:
        return None, "the cluster wrote no metadata (started without Ray's usage library)"
    try:
        version = json.loads(raw).get("ray_version")
    except (ValueError, AttributeError):
        return None, "the cluster's metadata is not JSON"
    return (str(version), "") if version else (None, "the cluster's metadata names no Ray version")


def installed_ray_version(raylet_path: str) -> Optional[str]:
    """The Ray release a file of Ray's package belongs to (the raylet binary,
    ``.../site-packages/ray/core/src/ray/raylet/raylet``), from the ``ray-X.dist-info``
    beside the package: no process started."""
    directory = os.path.dirname(os.path.abspath(raylet_path))
    while os.path.dirname(directory) != directory:
        parent = os.path.dirname(directory)
        if os.path.basename(directory) == "ray":
            found = glob.glob(os.path.join(parent, "ray-*.dist-info"))
            if len(found) == 1:
                return os.path.basename(found[0])[len("ray-") : -len(".dist-info")]
        directory = parent
    return None


def reader_ray_version() -> Optional[str]:
    """The Ray this interpreter would import, from the dist-info beside its package (no
    ``import ray``, no scan of every installed distribution)."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    return installed_ray_version(spec.origin) if spec is not None and spec.origin else None
