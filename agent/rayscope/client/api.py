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

from rayscope.client import arguments as check
from rayscope.core import limits
from rayscope.defaults import DEFAULT_TIMEOUT_S
from rayscope.errors import EXIT_INTERNAL, AgentError, RayscopeError
from rayscope.net.addresses import parse_gcs_address

if TYPE_CHECKING:
    from rayscope.schema.fit import FitRequest, FitResult
    from rayscope.schema.status import ClusterStatus

__all__ = ["RayscopeError", "cluster_state", "fit", "usage"]

NO_DASHBOARD = "none"
"""``dashboard=`` that reads no Ray dashboard (any case, as ``--dashboard`` takes it)."""


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


_usage = check.usage


def _source(gcs: object, head: object, dashboard: object) -> Source:
    """The arguments that say where to read, checked as the command line checks ``--gcs``,
    ``--head`` (one of them) and ``--dashboard``."""
    from rayscope.client.request import parse_head_url

    gcs = check.text("gcs", gcs, check.MAX_ADDRESS_CHARS)
    head = check.text("head", head, check.MAX_ADDRESS_CHARS)
    dashboard = check.text("dashboard", dashboard, check.MAX_ADDRESS_CHARS)
    if head is not None and gcs is not None:
        raise _usage("head= with gcs=: two sources, give one (head= reads a head agent, gcs= the GCS)")
    if dashboard is not None and head is not None:
        raise _usage("dashboard= with head=: a head reads the dashboard itself, give one")
    if dashboard is not None and dashboard.strip().lower() != NO_DASHBOARD:
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
    """``label_selector=`` checked as a mapping of strings (Ray's own type for it), then as
    Ray would parse it."""
    from rayscope.core.capacity import selectors

    if selector is None:
        return None
    checked = check.mapping(
        "label_selector", selector, check.label_value, "a dict of str to str, e.g. {'zone': '!in(a,b)'}"
    )
    try:
        selectors.parse(checked)
    except ValueError as err:
        raise _usage(f"label_selector=: {err}") from None
    return checked


def _shape(shape: object, num_cpus: float, memory_mb: float) -> Optional[dict[str, float]]:
    """``shape=`` checked as a dict of Ray resource names to amounts, then as ``--shape``
    is (:func:`rayscope.core.capacity.sizing.validate_shape`); with ``num_cpus`` and
    ``memory_mb``, each resource given once."""
    from rayscope.core.capacity.sizing import validate_shape

    if shape is None:
        return None
    example = "{'GPU': 0.5, 'CPU': 1}, memory in bytes"
    try:
        checked = validate_shape(check.mapping("shape", shape, check.amount, example))
    except ValueError as err:
        raise _usage(f"shape=: {err}") from None
    if num_cpus > 0 and "CPU" in checked:
        raise _usage("num_cpus= and a CPU in shape=: give CPUs once")
    if memory_mb > 0 and "memory" in checked:
        raise _usage("memory_mb= and a memory in shape=: give memory once")
    return checked


def _token_file(token_file: object) -> Optional[str]:
    return check.text("token_file", token_file, check.MAX_PATH_CHARS, path=True)


def _timeout(timeout: object) -> float:
    return float(check.number("timeout", timeout, limits.SECONDS))


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
    ``timeout``: seconds for the whole read. Raises :class:`RayscopeError` (a bad argument:
    before anything is read, naming it; :mod:`rayscope.client.arguments`).
    """
    with _one_error():
        from rayscope.render.status import status_json

        source = _source(gcs, head, dashboard)
        token_file = _token_file(token_file)
        seconds = _timeout(timeout)
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
    fraction); or ``shape``: a raw Ray resource shape, a dict (``{"GPU": 0.5, "CPU": 1}``,
    memory in bytes; a list of pairs is refused). ``num_cpus``, ``memory_mb`` (MB): what each
    replica books besides (0: as declared).
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
        token_file = _token_file(token_file)
        seconds = _timeout(timeout)
        if gpu_memory_mb is not None and shape is not None:
            raise _usage(
                "gpu_memory_mb= with shape=: give one (a size as BioEngine declares it, or a raw shape)"
            )
        if gpu_memory_mb is None and shape is None:
            raise _usage("give gpu_memory_mb= (MB per replica, -1: a whole GPU) or shape= (a raw Ray shape)")
        if gpu_memory_mb is not None:
            gpu_memory_mb = int(check.number("gpu_memory_mb", gpu_memory_mb, limits.GPU_MEMORY_MB))
        count = int(check.number("replicas", replicas, limits.REPLICAS))
        cpus = float(check.number("num_cpus", num_cpus, limits.CPUS))
        mebibytes = float(check.number("memory_mb", memory_mb, limits.MEBIBYTES))
        checked_shape = _shape(shape, cpus, mebibytes)
        shape_json = None if checked_shape is None else json.dumps(checked_shape)
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
        token_file = _token_file(token_file)
        seconds = _timeout(timeout)
        window_s: Optional[float] = None
        if window is not None and not isinstance(window, str):
            window_s = float(check.number("window", window, check.window_limit()))
        window_text = None if window_s is not None else check.text("window", window, check.MAX_WINDOW_CHARS)
        try:
            window_s = window_s if window_text is None else parse_window(window_text)
        except ValueError as err:
            raise _usage(f"window=: {err}") from None
        doc = client.read_usage(
            source.head, token_file, seconds, window_s, DEFAULT_HEADROOM_PCT, TlsFiles.from_env()
        )
        return _document(usage_json(doc))
