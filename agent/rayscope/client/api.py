"""rayscope as a library: the documents of ``status --json``, ``fit --json`` and ``usage --json``
as dicts, for programs such as BioEngine's cluster actor (docs/api.md).

Each call runs the command line's own path (:func:`rayscope.client.head.read_cluster`, the
GCS read in a child process under a deadline, :mod:`rayscope.core.capacity.fit`), so it is
synchronous, never calls ``ray.init()``, never prints and holds no thread or process after
it returns: safe inside a Ray actor. Every failure is one :class:`RayscopeError` whose
``str()`` is the one line the command line would print (bad arguments included).

Imported when first used (``rayscope.fit`` …): ``import rayscope`` itself stays as cheap as
``status --head``'s fast path needs it.
"""

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

from rayscope.core import limits
from rayscope.defaults import DEFAULT_TIMEOUT_S
from rayscope.errors import EXIT_INTERNAL, EXIT_USAGE, AgentError, RayscopeError
from rayscope.net.addresses import parse_gcs_address

if TYPE_CHECKING:
    from rayscope.schema.fit import FitRequest, FitResult
    from rayscope.schema.status import ClusterStatus

__all__ = ["RayscopeError", "cluster_state", "fit", "usage"]

NO_DASHBOARD = "none"
"""``dashboard=`` that reads no Ray dashboard (as ``None``)."""


class Source(NamedTuple):
    """Where the cluster is read: a head agent's URL, else the GCS (``None``: found as the
    command line finds it: ``$RAY_ADDRESS``, the local raylet's, Ray's address file)."""

    head: Optional[str]
    gcs: Optional[str]
    dashboard: Optional[str] = None
    """Ray's dashboard URL, or ``none`` (``None``: where the GCS says it is)."""


@contextmanager
def _one_error() -> Iterator[None]:
    """Every failure as :class:`RayscopeError`: rayscope's own (:class:`AgentError`) with its
    message and exit code, anything else as the command line says a bug of ours (exit 70),
    the cause chained for the caller's traceback. Ctrl-C stays Ctrl-C."""
    try:
        yield
    except RayscopeError:
        raise
    except AgentError as err:
        raise RayscopeError(str(err), err.exit_code) from None
    except Exception as err:
        raise RayscopeError(f"internal error: {type(err).__name__}: {err}", EXIT_INTERNAL) from err


def _usage(message: str) -> RayscopeError:
    return RayscopeError(message, EXIT_USAGE)


def _number(name: str, value: object, limit: limits.Limit) -> float:
    """``value`` checked as the command line checks its option (:func:`rayscope.core.limits.check`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _usage(f"{name}={value!r}: not a number: {limits.wanted(limit)}")
    try:
        return limits.check(name, value, limit)
    except ValueError as err:
        raise _usage(str(err)) from None


def _source(gcs: Optional[str], head: Optional[str], dashboard: Optional[str]) -> Source:
    """The arguments that say where to read, checked as the command line checks ``--gcs``,
    ``--head`` (one of them) and ``--dashboard``."""
    from rayscope.client.request import parse_head_url

    if head is not None and gcs is not None:
        raise _usage("head= with gcs=: two sources, give one (head= reads a head agent, gcs= the GCS)")
    if dashboard is not None and head is not None:
        raise _usage("dashboard= with head=: a head reads the dashboard itself, give one")
    if dashboard is not None and dashboard != NO_DASHBOARD:
        from rayscope.sources.dashboard import parse_url

        try:
            parse_url(dashboard)
        except ValueError as err:
            raise _usage(f"dashboard=: {err}") from None
    try:
        return Source(
            head=None if head is None else parse_head_url(head),
            gcs=None if gcs is None else parse_gcs_address(gcs),
            dashboard=dashboard,
        )
    except ValueError as err:
        raise _usage(f"{'head' if head is not None else 'gcs'}=: {err}") from None


def _selector(selector: object) -> Optional[dict[str, str]]:
    """``label_selector=`` checked as a mapping of strings (Ray's own type for it)."""
    if selector is None:
        return None
    if not isinstance(selector, Mapping) or not all(
        isinstance(x, str) for item in selector.items() for x in item
    ):
        raise _usage(f"label_selector={selector!r}: give a dict of str to str, e.g. {{'zone': '!in(a,b)'}}")
    return dict(selector)


def _document(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(text)
    return doc


def read_status(source: Source, token_file: Optional[str], timeout_s: float, gpus: bool) -> "ClusterStatus":
    """The cluster as ``status`` and ``fit`` read it (:func:`rayscope.client.head.read_cluster`)."""
    from rayscope.client import head as client

    head, gcs = source.head, source.gcs
    return client.read_cluster(head, token_file, gcs, timeout_s, gpus, dashboard=source.dashboard)


def fit_result(
    request: "FitRequest", source: Source, token_file: Optional[str], timeout_s: float
) -> "FitResult":
    """``rayscope fit``'s answer: the cluster read with the actor table (Ray's per-device
    placement, :mod:`rayscope.core.gpu.placement`), then the replicas placed."""
    from rayscope.core.capacity import fit as fitting

    return fitting.fit(read_status(source, token_file, timeout_s, gpus=True), request)


def cluster_state(
    gcs: Optional[str] = None,
    head: Optional[str] = None,
    token_file: Optional[str] = None,
    dashboard: Optional[str] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """The status document, as ``rayscope status --json`` prints it: BioEngine's
    ``get_cluster_state()`` shape (``{"cluster": ..., "nodes": {node_id: ...}}``) plus
    rayscope's keys (schema 2: ``schema``, ``generated_at``, ``sources``, per node ``gpus``,
    ``stale``, ``alive`` …; docs/api.md). Alive nodes only.

    ``gcs``: ``HOST[:PORT]`` of the GCS (default port 6379; ``None``: ``$RAY_ADDRESS``, else
    the local raylet's, else Ray's address file). ``head``: a head agent's URL
    (``http://HOST:7532``) instead, with its ``token_file``; give one of the two.
    ``dashboard``: Ray's dashboard URL, read for every node no agent measures (``None``: where
    the GCS publishes it; ``"none"``: not read).
    ``timeout``: seconds for the whole read. Raises :class:`RayscopeError`.
    """
    with _one_error():
        from rayscope.render.status import status_json

        source = _source(gcs, head, dashboard)
        seconds = _number("timeout", timeout, limits.SECONDS)
        return _document(status_json(read_status(source, token_file, seconds, gpus=False)))


def fit(
    gpu_memory_mb: Optional[int] = None,
    shape: Optional[Mapping[str, float]] = None,
    replicas: int = 1,
    num_cpus: float = 0.0,
    memory_mb: float = 0.0,
    gcs: Optional[str] = None,
    head: Optional[str] = None,
    token_file: Optional[str] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    label_selector: Optional[Mapping[str, str]] = None,
) -> dict[str, Any]:
    """Would ``replicas`` more replicas fit now? The document of ``rayscope fit --json``:
    ``fits`` is the answer (by booking, and not refuted by the memory NVML measures),
    ``shape`` the Ray resources one replica books, ``nodes`` where they would go.

    ``gpu_memory_mb``: GPU memory per replica as a BioEngine app declares it (-1: a whole
    GPU), sized the way BioEngine books it (``VRAM_MB`` where nodes advertise it, else a GPU
    fraction); or ``shape``: a raw Ray resource shape (``{"GPU": 0.5, "CPU": 1}``, memory in
    bytes). ``num_cpus``, ``memory_mb`` (MB): what each replica books besides (0: as declared).
    ``label_selector``: Ray's (``{"zone": "!in(a,b)"}``): only the nodes it admits are
    candidates (``admitted_nodes`` counts them; none: ``fits`` is false and ``label_miss``
    says why; a Ray before 2.49 has no labels: :class:`RayscopeError`, exit 2).
    ``gcs``, ``head``, ``token_file``, ``timeout``: as :func:`cluster_state`. A request that
    cannot be booked at all (more GPU memory than the smallest GPU) answers ``fits: False``
    with ``refused``; a cluster that cannot be read raises :class:`RayscopeError`.
    """
    with _one_error():
        from rayscope.core.capacity.fit_labels import with_label_selector
        from rayscope.core.capacity.sizing import fit_request
        from rayscope.render.fit import fit_json

        source = _source(gcs, head, None)
        seconds = _number("timeout", timeout, limits.SECONDS)
        if gpu_memory_mb is not None:
            gpu_memory_mb = int(_number("gpu_memory_mb", gpu_memory_mb, limits.GPU_MEMORY_MB))
        count = int(_number("replicas", replicas, limits.REPLICAS))
        cpus = _number("num_cpus", num_cpus, limits.CPUS)
        mebibytes = _number("memory_mb", memory_mb, limits.MEBIBYTES)
        shape_json = None if shape is None else json.dumps(dict(shape))
        request = with_label_selector(
            fit_request(gpu_memory_mb, shape_json, count, cpus, mebibytes), _selector(label_selector)
        )
        return _document(fit_json(fit_result(request, source, token_file, seconds)))


def usage(
    head: str,
    token_file: Optional[str] = None,
    window: Union[float, str, None] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Each app's peak GPU memory beside its booking, as ``rayscope usage --json`` prints it
    (the head agent remembers; ``head`` is its URL, required). ``window``: the last seconds
    (``1800``) or span (``"30m"``, ``"1h"``, ``"7d"``) only; ``None``: the head's whole window.
    Raises :class:`RayscopeError`.
    """
    with _one_error():
        from rayscope.client import head as client
        from rayscope.core.usage.summary import DEFAULT_HEADROOM_PCT, parse_window
        from rayscope.net.tls import TlsFiles
        from rayscope.render.usage import usage_json

        source = _source(None, head, None)
        if source.head is None:
            raise _usage("usage needs head=, the head agent's URL: only the head remembers")
        seconds = _number("timeout", timeout, limits.SECONDS)
        try:
            window_s = None if window is None else parse_window(str(window))
        except ValueError as err:
            raise _usage(f"window=: {err}") from None
        doc = client.read_usage(
            source.head, token_file, seconds, window_s, DEFAULT_HEADROOM_PCT, TlsFiles.from_env()
        )
        return _document(usage_json(doc))
