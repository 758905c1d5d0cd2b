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
a demand's label selectors                 2.49            ``ResourceRequest.label_selectors``
                                                           of ``ray.rpc.LabelSelector`` only
                                                           (2.46-2.48: a type of the
                                                           autoscaler's own, selectors ignored
                                                           by their scheduler); none before
a request's fallback selectors             2.58            the same list after the first
                                                           (2.53-2.57: not in the autoscaler
                                                           state; the actor table's, 2.55+)
a placement group's bundle selectors       2.49            ``bundle_selectors[0]``, one
                                                           ``ResourceRequest`` per bundle
an actor's selector / its fallbacks        2.49 / 2.55     ``ActorTableData.label_selector``
                                                           (Ray's syntax) / ``fallback_strategy``
cluster's Ray version                      never           KV ``cluster/CLUSTER_METADATA``
the dashboard's address                    never (measured KV ``dashboard/webui:url``, else
                                           2.33-2.60)      ``dashboard/dashboard``
what ``ray/__init__`` sets up for          any release     :func:`import_raylet` does only that
``ray._raylet`` (and ``ray.util``'s)                       much; if a Ray needs more, the read
                                                           is run again with ``import ray``
=========================================  ==============  ==================================

Standalone like ``gcs_read`` (the standard library and, lazily, ``ray``): ``gcs.py`` runs
the two joined as one script under a Ray node's own Python. A fact an old Ray cannot give is
``None`` with a reason, never an exception that fails the whole read.
"""

import glob
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, Optional

CLUSTER_METADATA_KEY = b"CLUSTER_METADATA"
"""Written by the head at ``ray start`` (Ray's usage library) into the KV namespace below,
in every supported release: ``{"ray_version": ..., "python_version": ...}``."""
CLUSTER_METADATA_NAMESPACE = b"cluster"
MAX_METADATA_BYTES = 64 * 1024
"""Ray's metadata is one flat object of a few hundred bytes."""


def _ray(module: str) -> Any:
    return importlib.import_module(module)


class LightImportFailed(Exception):
    """``ray._raylet`` without ``ray/__init__`` did not work under this Ray: read again with a
    whole ``import ray`` (in a new process: a half-initialised ``_raylet`` cannot be retried)."""


LIGHT_IMPORT_SYMPTOMS = (AttributeError, ImportError, NameError)
"""What a Ray module raises when it needs something a package's ``__init__`` sets up and
:func:`import_raylet` did not run (``ray.__version__`` was one, under 2.60)."""
LIGHT_PACKAGES = ("ray", "ray.util")
"""Packages whose ``__init__`` a GCS read does not run: ``ray``'s imports the worker, actors
and runtime environments; ``ray.util``'s (reached through ``ray.exceptions``) placement
groups, accelerators and, through the TPU's, ``requests``. Under Ray 2.60 the two are 550 of
the 700 modules ``import ray._raylet`` loads, ~170 ms of its ~280 ms; the read uses none."""


def import_raylet(light: bool) -> Any:
    """``ray._raylet`` (the GCS client), for a process that does nothing but read the GCS.

    ``light``: without running the ``__init__`` of :data:`LIGHT_PACKAGES` (their modules
    are there, each imported when something names it). What ``_raylet`` needs of
    ``ray/__init__`` is done here as it does it: ``thirdparty_files`` first on the path,
    ``_raylet.so`` loaded with its symbols global, ``ray.__version__``.
    :class:`LightImportFailed` when that is not enough for this Ray; never in the head
    agent's own process (it imports ray whole).
    """
    spec = importlib.util.find_spec("ray") if light else None
    if spec is None or not spec.submodule_search_locations or "ray" in sys.modules:
        return _ray("ray._raylet")  # not there: the same ModuleNotFoundError as ever
    package = next(iter(spec.submodule_search_locations))
    try:
        sys.path.insert(0, os.path.join(package, "thirdparty_files"))
        shared = os.path.join(package, "_raylet.so")
        if os.path.exists(shared):
            import ctypes

            ctypes.CDLL(shared, ctypes.RTLD_GLOBAL)
        for name in LIGHT_PACKAGES:
            found = importlib.util.find_spec(name)
            if found is None:
                raise ImportError(f"no {name} package")
            sys.modules[name] = importlib.util.module_from_spec(found)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, sys.modules[name])
        ray: Any = sys.modules["ray"]
        version = _ray("ray._version")
        ray.__version__, ray.__commit__ = version.version, version.commit
        return _ray("ray._raylet")
    except LIGHT_IMPORT_SYMPTOMS as err:
        raise LightImportFailed(f"{type(err).__name__}: {err}") from None


def _fields(message: Any) -> set[str]:
    return set(message.DESCRIPTOR.fields_by_name)


def _str_map(entries: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(entries).items()}


def node_labels(info: Optional[Any], state: Optional[Any]) -> dict[str, str]:
    """A node's labels: ``GcsNodeInfo.labels`` (every release) merged with the autoscaler
    state's ``labels`` (2.49+) or, before it had those, its ``dynamic_labels``."""
    labels = _str_map(info.labels) if info is not None and "labels" in _fields(info) else {}
    if state is not None:
        for name in ("labels", "dynamic_labels"):
            if name in _fields(state):
                labels.update(_str_map(getattr(state, name)))
                break
    return labels


LABEL_SELECTOR_TYPE = "ray.rpc.LabelSelector"
"""The selector type of Ray 2.49+, the first whose scheduler honours it (Ray 2.46 ran an
actor selecting a label no node had)."""
OPERATORS = {"LABEL_OPERATOR_IN": "in", "LABEL_OPERATOR_NOT_IN": "!in"}


def _constraints(selector: Any) -> list[dict[str, Any]]:
    """One ``LabelSelector`` as ``[{"key", "operator", "values"}]``: ``in``/``!in``, any other
    operator by its enum name (``LABEL_OPERATOR_UNSPECIFIED``), verbatim."""
    out = []
    for constraint in selector.label_constraints:
        enum = constraint.DESCRIPTOR.fields_by_name["operator"].enum_type
        known = enum.values_by_number.get(int(constraint.operator))
        name = known.name if known is not None else str(int(constraint.operator))
        values = [str(v) for v in constraint.label_values]
        out.append(
            {"key": str(constraint.label_key), "operator": OPERATORS.get(name, name), "values": values}
        )
    return out


def request_selectors(request: Any) -> list[list[dict[str, Any]]]:
    """A ``ResourceRequest``'s label selectors (the selector, then its fallbacks), ``[]``
    where this Ray keeps none its scheduler honours (see the table above)."""
    field = request.DESCRIPTOR.fields_by_name.get("label_selectors")
    if field is None or field.message_type.full_name != LABEL_SELECTOR_TYPE:
        return []
    return [_constraints(selector) for selector in request.label_selectors]


def gang_selectors(gang: Any) -> list[list[dict[str, Any]]]:
    """A ``GangResourceRequest``'s selector per bundle (``bundle_label_selector``), in the
    order of its bundles; ``[]`` where it has none."""
    if "bundle_selectors" not in _fields(gang) or not gang.bundle_selectors:
        return []
    per_bundle = [request_selectors(r) for r in gang.bundle_selectors[0].resource_requests]
    if not any(per_bundle):
        return []
    return [selectors[0] if selectors else [] for selectors in per_bundle]


def actor_selector(info: Any) -> Optional[dict[str, str]]:
    """An actor table entry's ``label_selector`` in Ray's syntax (2.49+), ``None`` without one."""
    if "label_selector" not in _fields(info) or not info.label_selector:
        return None
    return _str_map(info.label_selector)


def actor_fallbacks(info: Any) -> list[list[dict[str, Any]]]:
    """An actor table entry's ``fallback_strategy`` selectors in order (2.55+), ``[]`` without."""
    if "fallback_strategy" not in _fields(info) or not info.HasField("fallback_strategy"):
        return []
    return [_constraints(option.label_selector) for option in info.fallback_strategy.options]


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


def actor_tables(client: Any, address: str, timeout_s: float, states: Sequence[str]) -> list[list[Any]]:
    """:func:`actor_table` for each of ``states``, the calls at once where this Ray's client
    is asynchronous (2.35+), one after the other otherwise."""
    if hasattr(client, "get_all_actor_info") or not hasattr(client, "async_get_all_actor_info"):
        return [actor_table(client, address, timeout_s, state) for state in states]
    import asyncio

    async def fetch() -> list[Any]:
        calls = [client.async_get_all_actor_info(actor_state_name=s, timeout=timeout_s) for s in states]
        return list(await asyncio.gather(*calls))

    return [
        list(infos.values()) if isinstance(infos, dict) else list(infos) for infos in asyncio.run(fetch())
    ]


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
    if len(raw) > MAX_METADATA_BYTES:
        return None, f"the cluster's metadata is over {MAX_METADATA_BYTES // 1024} KiB: not Ray's"
    try:
        version = json.loads(raw).get("ray_version")
    # Any peer of a cluster without token auth writes the KV: nested past the recursion limit, it
    # raised RecursionError, and the child died with the whole read (this script cannot import
    # rayscope.net.peer_json; its stack here is a few frames deep).
    except (ValueError, AttributeError, RecursionError):
        return None, "the cluster's metadata is not JSON"
    return (str(version), "") if version else (None, "the cluster's metadata names no Ray version")


DASHBOARD_NAMESPACE = b"dashboard"
DASHBOARD_KEYS = (b"webui:url", b"dashboard")
"""Where a head started with its dashboard publishes the dashboard's ``HOST:PORT``, in every
supported release (``ray start`` writes the first once the dashboard answers, the dashboard
itself the second; both hold the same text). Absent: no dashboard (``ray`` without
``[default]``, ``--include-dashboard=false``) or one that never came up."""
MAX_DASHBOARD_URL_BYTES = 2048


def dashboard_url(client: Any, timeout_s: float) -> tuple[Optional[str], str]:
    """(the dashboard's address as the cluster published it, ``""``) or ``(None, why not)``;
    the text is the GCS's, unchecked: the caller parses it (``rayscope.sources.dashboard``)."""
    for key in DASHBOARD_KEYS:
        try:
            raw = client.internal_kv_get(key, DASHBOARD_NAMESPACE, timeout=timeout_s)
        except Exception as err:
            return None, f"dashboard address not readable: {type(err).__name__}: {err}"
        if raw:
            if len(raw) > MAX_DASHBOARD_URL_BYTES:
                return None, f"the published dashboard address is over {MAX_DASHBOARD_URL_BYTES} bytes"
            return raw.decode("utf-8", "replace"), ""
    return None, "the cluster published no dashboard address"


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
