"""The Ray scheduler's view of every node, read from the GCS without ``ray.init()``.

Where the address comes from, in order: ``--gcs``, ``RAYSCOPE_GCS``, the local raylet's
command line, ``<ray temp dir>/ray_current_cluster``; a raylet or a file only when root or the
user running rayscope owns it (SECURITY.md, rule 1: the Ray token goes to that address).
Ray's ``GcsClient`` constructor blocks about 40 s on an unreachable address whatever timeout
it is given, so every read runs under our own deadline (default 5 s), after a TCP connect
check that fails fast on a closed port:

* one-shot reads (the CLI) run ``gcs_read`` as a child process, killed at the deadline — no
  thread left blocked in Ray's C++ client, Ray's C++ log lines kept off the terminal, and
  Ray's import cost and process-wide state kept out of rayscope's own process;
* the head agent keeps one in-process client (:class:`GcsReader`) and reads it once per
  interval in a worker thread under the same deadline.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional, TypeVar

import msgspec

from agent.addresses import DEFAULT_TIMEOUT_S, GCS_ADDRESS_ENV, split_address
from agent.schema.pending import PendingRead
from agent.schema.report import RayletInfo, SourceStatus
from agent.schema.status import ActorBooking, RayNode
from agent.sources import gcs_read, raycompat, trust

T = TypeVar("T")

ADDRESS_FILE = "ray_current_cluster"


class GcsUnavailable(Exception):
    """The GCS could not be read; ``str()`` is the operator's one-line reason."""


def ray_temp_dir(environ: Mapping[str, str]) -> str:
    """Ray's own rule: ``$RAY_TMPDIR``, else ``$TMPDIR``, else ``/tmp``; then ``/ray``.
    The environment is the invoking user's, so trusted; the directory it names is not."""
    return os.path.join(environ.get("RAY_TMPDIR") or environ.get("TMPDIR") or "/tmp", "ray")


MAX_ADDRESS_FILE_BYTES = 4096


def address_from_file(environ: Mapping[str, str]) -> tuple[Optional[str], str]:
    """(the address ``ray start`` wrote for local drivers, why there is none).

    ``<ray temp dir>/ray_current_cluster`` is read only when root or this user owns it and
    every directory above it, and nobody else can write them (SECURITY.md, rule 1:
    :func:`trust.open_trusted`): under a world-writable ``/tmp`` anyone can create ``ray/``
    first and name their own port, and root would send its Ray token there. A FIFO is
    refused at once, never waited on."""
    path = os.path.join(ray_temp_dir(environ), ADDRESS_FILE)
    try:
        fd = trust.open_trusted(path, os.geteuid())
    except trust.Refused as refusal:
        return None, f"refused {path}: {refusal}"
    except (FileNotFoundError, NotADirectoryError):
        return None, f"no {ADDRESS_FILE} file in {os.path.dirname(path)}"
    except OSError as err:
        return None, f"cannot read {path}: {err.strerror}"
    try:
        data = os.read(fd, MAX_ADDRESS_FILE_BYTES)
    except OSError as err:
        return None, f"cannot read {path}: {err.strerror}"
    finally:
        os.close(fd)
    address = data.decode("utf-8", "replace").strip()
    return (address, "") if address else (None, f"{path} is empty")


def resolve_address(
    explicit: Optional[str],
    environ: Mapping[str, str],
    raylets: Sequence[RayletInfo],
    refused_raylets: str = "",
) -> tuple[Optional[str], str]:
    """(address, where it came from); ``(None, why)`` when no source names one.

    ``raylets`` are those :func:`agent.sources.raylet.find_raylets` trusts (root's or this
    user's: another user's raylet is no source of the address); ``refused_raylets`` says
    which it refused and why, for the message when nothing else names a cluster. The Ray
    token goes to the address returned, so every source here is one only root or this user
    controls: ``--gcs``, the environment, those raylets, a trusted address file."""
    if explicit:
        return explicit, "--gcs"
    if environ.get(GCS_ADDRESS_ENV):
        return environ[GCS_ADDRESS_ENV], GCS_ADDRESS_ENV
    from_raylets = sorted({r.gcs_address for r in raylets if r.gcs_address})
    if len(from_raylets) > 1:
        clusters = ", ".join(from_raylets)
        return None, f"raylets of {len(from_raylets)} clusters run on this host ({clusters}): pass --gcs"
    if from_raylets:
        pids = ", ".join(str(r.pid) for r in raylets if r.gcs_address)
        return from_raylets[0], f"raylet pid {pids}"
    from_file, why_not = address_from_file(environ)
    if from_file:
        return from_file, os.path.join(ray_temp_dir(environ), ADDRESS_FILE)
    no_raylet = refused_raylets or "no raylet process on this host"
    return None, f"no GCS address: pass --gcs HOST:PORT or set {GCS_ADDRESS_ENV} ({no_raylet}; {why_not})"


def ray_importable() -> bool:
    return importlib.util.find_spec("ray") is not None


def _runnable(path: str) -> bool:
    return os.path.isabs(path) and os.access(path, os.X_OK)


def gcs_python(
    raylets: Sequence[RayletInfo],
    address: str,
    ray_here: bool,
    runnable: Callable[[str], bool] = _runnable,
    ray_here_version: Callable[[], Optional[str]] = raycompat.reader_ray_version,
) -> Optional[str]:
    """The interpreter to run the GCS read under: the Ray node's own Python (the first word
    of a local raylet's worker command; raylets of the cluster at ``address`` first, then any
    other: a Ray node's Python can import ray) when this one cannot import ray, or when it
    can but its Ray is another release than the one that raylet of this cluster runs;
    else this one. ``None`` when there is neither."""
    ordered = [
        r
        for r in sorted(raylets, key=lambda r: r.gcs_address != address)
        if r.python_executable and runnable(r.python_executable)
    ]
    if ray_here:
        mine = next((r for r in ordered if r.gcs_address == address and r.ray_version), None)
        if mine is not None and mine.ray_version != ray_here_version():
            return mine.python_executable
        return sys.executable
    return ordered[0].python_executable if ordered else None


def _no_ray_reason() -> str:
    return (
        f"ray is not importable by this Python ({sys.executable}) and no local raylet"
        " names the Ray node's Python: run rayscope with a Python that has ray"
    )


MAX_BLOCKED_CALLS = 3
"""GCS calls left blocking past their deadline before the reader stops trying (each holds a
daemon thread until Ray's client returns)."""


def _with_deadline(fn: Callable[[], T], timeout_s: float, busy: list[threading.Thread]) -> T:
    """Run ``fn`` in a daemon thread; ``TimeoutError`` if it has not returned in time.

    Threads that overran are remembered in ``busy``: at most ``MAX_BLOCKED_CALLS`` are left
    blocking (a long-running head agent must not pile threads onto a hung GCS), but one
    stuck call on a client that was given up does not stop a fresh client from reaching a
    GCS that came back (a call to a killed GCS was seen to block for minutes).
    """
    busy[:] = [t for t in busy if t.is_alive()]
    if len(busy) >= MAX_BLOCKED_CALLS:
        raise TimeoutError(f"{len(busy)} earlier GCS calls still blocked")
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as err:  # handed to the caller's thread
            box.append((False, err))

    thread = threading.Thread(target=run, name="rayscope-gcs", daemon=True)
    busy.append(thread)
    thread.start()
    thread.join(timeout_s)
    if not box:
        raise TimeoutError
    ok, value = box[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def check_port(address: str, timeout_s: float) -> None:
    """Fail fast, with the reason, when nothing listens at the GCS address."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except ConnectionRefusedError:
        raise GcsUnavailable(f"GCS unreachable at {address} (connection refused)") from None
    except socket.timeout:
        raise GcsUnavailable(f"GCS unreachable at {address} (timeout {timeout_s:g} s)") from None
    except OSError as err:
        raise GcsUnavailable(f"GCS unreachable at {address} ({err.strerror or type(err).__name__})") from None


def explain(err: BaseException, address: str, timeout_s: float, token_source: Optional[str]) -> str:
    """A GCS client error in the operator's words."""
    text = str(err)
    lowered = text.lower()
    if isinstance(err, TimeoutError) or "timed out" in lowered or "deadline" in lowered:
        return f"GCS unreachable at {address} (timeout {timeout_s:g} s)"
    if "unauthenticated" in lowered or "authentication" in lowered or "token" in lowered:
        if token_source:
            return f"GCS at {address} rejected the token from {token_source}"
        return (
            f"GCS at {address} requires token authentication:"
            " set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (and RAY_AUTH_MODE=token)"
        )
    first_line = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return f"GCS at {address} failed: {first_line}"


class GcsReader:
    """Reads the scheduler's view; keeps its client between reads (the head agent polls)."""

    def __init__(self, address: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._client: Any = None
        self._busy: list[threading.Thread] = []
        self._token_source = gcs_read.prepare_auth_env(os.environ)
        self.versions: Optional[SourceStatus] = None
        """``ray``: the cluster's release and this process's, read once per connection."""

    def read_raw(self) -> list[dict]:  # type: ignore[type-arg]
        """Plain node dicts (``gcs_read``'s format); raises :class:`GcsUnavailable`."""
        if not ray_importable():
            raise GcsUnavailable(f"ray is not importable by this Python ({sys.executable})")
        try:
            deadline = time.monotonic() + self.timeout_s  # one for the check, connect and read
            if self._client is None:
                check_port(self.address, self.timeout_s)
                left = remaining_s(deadline, self.address, self.timeout_s)
                self._client = _with_deadline(lambda: gcs_read.connect(self.address), left, self._busy)
                connected = self._client
                left = remaining_s(deadline, self.address, self.timeout_s)
                cluster, why = _with_deadline(
                    lambda: raycompat.cluster_ray_version(connected, left), left, self._busy
                )
                self.versions = ray_versions_status(gcs_read.ray_version(), cluster, why)
            client = self._client
            left = remaining_s(deadline, self.address, self.timeout_s)
            return _with_deadline(lambda: gcs_read.read_nodes(client, left), left, self._busy)
        except GcsUnavailable:
            raise
        except Exception as err:
            self._client = None  # reconnect next time: the GCS may have restarted
            raise GcsUnavailable(explain(err, self.address, self.timeout_s, self._token_source)) from err

    def read_actors(self) -> tuple[Optional[list[ActorBooking]], SourceStatus]:
        """Every live actor (the head agent's attribution input); never raises."""
        if self._client is None:
            self.read()  # connects, or says why not
        client = self._client
        if client is None:
            return None, SourceStatus(name="gcs_actors", ok=False, reason="GCS not connected")
        try:
            raw = _with_deadline(
                lambda: gcs_read.read_actors(client, self.address, self.timeout_s),
                self.timeout_s,
                self._busy,
            )
        except Exception as err:
            reason = explain(err, self.address, self.timeout_s, self._token_source)
            return None, SourceStatus(name="gcs_actors", ok=False, reason=reason)
        return _to_actors(raw, self.address)

    def read_pending(self) -> tuple[Optional[PendingRead], SourceStatus]:
        """What waits to be placed (the head agent reads it once per interval); never raises."""
        client = self._client
        if client is None:
            return None, SourceStatus(name="gcs_pending", ok=False, reason="GCS not connected")
        try:
            raw = _with_deadline(
                lambda: gcs_read.read_pending(client, self.address, self.timeout_s),
                self.timeout_s,
                self._busy,
            )
        except Exception as err:
            reason = explain(err, self.address, self.timeout_s, self._token_source)
            return None, SourceStatus(name="gcs_pending", ok=False, reason=reason)
        return _to_pending(raw, self.address)

    def read(self) -> tuple[list[RayNode], SourceStatus]:
        """Every node the GCS knows, and the source's status; never raises."""
        try:
            raw = self.read_raw()
        except GcsUnavailable as err:
            return [], SourceStatus(name="gcs", ok=False, reason=str(err), detail=self.address)
        return _to_nodes(raw, self.address, f"{self.address} in process")


def _to_nodes(raw: object, address: str, detail: str) -> tuple[list[RayNode], SourceStatus]:
    try:
        nodes = msgspec.convert(raw, list[RayNode])
    except msgspec.ValidationError as err:
        return [], SourceStatus(name="gcs", ok=False, reason=f"unexpected GCS answer from {address}: {err}")
    return nodes, SourceStatus(name="gcs", ok=True, detail=detail)


def remaining_s(deadline: float, address: str, timeout_s: float) -> float:
    """Seconds left before ``deadline`` (monotonic clock): one deadline for the port check
    and what follows it, never one each; :class:`GcsUnavailable` when none is left."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise GcsUnavailable(f"GCS unreachable at {address} (timeout {timeout_s:g} s)")
    return left


def child_script() -> str:
    """``raycompat`` then ``gcs_read``, one script for ``python -c`` (both are standalone)."""
    return "\n".join(
        module.__loader__.get_source(module.__name__)  # type: ignore[union-attr]
        for module in (raycompat, gcs_read)
    )


def _run_child(address: str, timeout_s: float, python: str, *extra: str) -> dict[str, Any]:
    """``gcs_read`` as a script under ``python``, the port check and the child under one
    deadline of ``timeout_s``: its whole JSON answer."""
    deadline = time.monotonic() + timeout_s
    check_port(address, timeout_s)
    left = remaining_s(deadline, address, timeout_s)
    source = child_script()
    if python == sys.executable:  # -I drops PYTHONPATH and the user site: keep where ray is
        source = trust.with_import_path(source, trust.parent_import_path("ray"))
    try:
        done = subprocess.run(  # isolated (SECURITY.md rule 1): -I, cwd /, Ray's variables only
            [python, "-I", "-c", source, address, f"{left:.3f}", *extra],
            cwd="/",
            env=trust.child_env(os.environ),
            capture_output=True,
            timeout=left,
            text=True,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise GcsUnavailable(_child_timeout(err, address, timeout_s, python)) from None
    except OSError as err:
        raise GcsUnavailable(f"cannot run {python} for the GCS read: {err.strerror}") from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        said = [line for line in done.stderr.strip().splitlines() if line != gcs_read.IMPORTED]
        last = (said or [f"exit code {done.returncode}"])[-1]
        raise GcsUnavailable(f"GCS read under {python} failed: {last}") from None
    if not answer.get("ok"):
        raise GcsUnavailable(
            explain(RuntimeError(answer.get("error", "")), address, timeout_s, _token_source())
        )
    return answer  # type: ignore[no-any-return]


def _child_timeout(err: subprocess.TimeoutExpired, address: str, timeout_s: float, python: str) -> str:
    """Why the child ran past the deadline: still importing ray (a loaded host, a slow
    filesystem), or waiting on a GCS whose port took the connection but did not answer."""
    stderr = err.stderr or b""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    if gcs_read.IMPORTED in text:
        return f"GCS unreachable at {address} (timeout {timeout_s:g} s)"
    return (
        f"GCS read stopped at its deadline (timeout {timeout_s:g} s) while {python} was still"
        " importing ray (a loaded host or a slow file system): the GCS was not asked; raise --timeout"
    )


def _token_source() -> Optional[str]:
    return gcs_read.prepare_auth_env(dict(os.environ))


def _to_actors(raw: object, address: str) -> tuple[Optional[list[ActorBooking]], SourceStatus]:
    try:
        actors = msgspec.convert(raw, list[ActorBooking])
    except msgspec.ValidationError as err:
        reason = f"unexpected actor table from {address}: {err}"
        return None, SourceStatus(name="gcs_actors", ok=False, reason=reason)
    return actors, SourceStatus(name="gcs_actors", ok=True, detail=f"{len(actors)} live actor(s)")


def _to_pending(raw: object, address: str) -> tuple[Optional[PendingRead], SourceStatus]:
    try:
        pending = msgspec.convert(raw, PendingRead)
    except msgspec.ValidationError as err:
        return None, SourceStatus(
            name="gcs_pending", ok=False, reason=f"unexpected pending demand from {address}: {err}"
        )
    waiting = sum(r.count for r in pending.requests) + len(pending.gangs)
    return pending, SourceStatus(name="gcs_pending", ok=True, detail=f"{waiting} waiting")


def read_pending_too(
    address: str, timeout_s: float, python: Optional[str], actors: bool
) -> tuple[list[RayNode], Optional[list[ActorBooking]], Optional[PendingRead], list[SourceStatus]]:
    """:func:`read_cluster` plus what waits to be placed, in the same child process (one
    deadline); the pending demand's status (``gcs_pending``) comes last."""
    box: list[Any] = []
    views, booked, statuses = read_cluster(address, timeout_s, python, actors, _answer=box)
    if not box:
        return views, booked, None, statuses
    answer = box[0]
    if "pending" not in answer:
        error = answer.get("pending_error", "no pending demand in the answer")
        reason = explain(RuntimeError(error), address, timeout_s, _token_source())
        return views, booked, None, [*statuses, SourceStatus(name="gcs_pending", ok=False, reason=reason)]
    pending, status = _to_pending(answer["pending"], address)
    return views, booked, pending, [*statuses, status]


def read_cluster(
    address: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    python: Optional[str] = None,
    actors: bool = False,
    _answer: Optional[list[Any]] = None,
) -> tuple[list[RayNode], Optional[list[ActorBooking]], list[SourceStatus]]:
    """One-shot read of every node (the CLI's path), in a child process under ``python``
    (default: this interpreter, which must then import ray). ``actors``: the live actors too,
    in the same child process (one deadline). Never raises.

    Statuses: the nodes' (``gcs``) first, then with ``actors`` the actor table's
    (``gcs_actors``), then the Ray releases of cluster and reader (``ray``) once the GCS
    answered; actors are ``None`` when not asked for or when the actor table did not
    answer, even if the nodes did.
    """
    python = python or sys.executable
    if python == sys.executable and not ray_importable():
        return [], None, [SourceStatus(name="gcs", ok=False, reason=_no_ray_reason(), detail=address)]
    try:
        extra = (["actors"] if actors else []) + (["pending"] if _answer is not None else [])
        answer = _run_child(address, timeout_s, python, *extra)
    except GcsUnavailable as err:
        return [], None, [SourceStatus(name="gcs", ok=False, reason=str(err), detail=address)]
    if _answer is not None:  # read_pending_too takes the rest of the answer
        _answer.append(answer)
    views, status = _to_nodes(answer["nodes"], address, f"{address} via {python}")
    versions = ray_versions_status(
        answer.get("ray_version"),
        answer.get("cluster_ray_version"),
        answer.get("cluster_ray_version_error", ""),
    )
    if not actors:
        return views, None, [status, versions]
    if "actors" not in answer:
        error = answer.get("actors_error", "no actor table in the answer")
        reason = explain(RuntimeError(error), address, timeout_s, _token_source())
        return views, None, [status, SourceStatus(name="gcs_actors", ok=False, reason=reason), versions]
    booked, actors_status = _to_actors(answer["actors"], address)
    return views, booked, [status, actors_status, versions]


def ray_versions_status(reader: Optional[str], cluster: Optional[str], why_unknown: str) -> SourceStatus:
    """``ray``: the cluster's Ray release and the reader's (the Python that read the GCS).
    Different releases still read (the GCS protocol held across 2.33-2.60), but the
    operator should know; an unknown cluster release is said, never guessed."""
    detail = f"cluster Ray {cluster or 'unknown'}, reader Ray {reader or 'unknown'}"
    if cluster is None:
        reason = f"the cluster's Ray version is unknown: {why_unknown or 'not reported'}"
    elif reader and reader != cluster:
        reason = f"the reader's Ray {reader} differs from the cluster's Ray {cluster}"
    else:
        reason = ""
    return SourceStatus(name="ray", ok=True, reason=reason, detail=detail)
