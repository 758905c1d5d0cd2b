"""The Ray scheduler's view of every node, read from the GCS without ``ray.init()``: the
head's in-process reader and what every read shares (the port check, the deadline, the
operator's reading of Ray's errors, the answer's conversion to Structs).

Where the address comes from: :mod:`rayscope.sources.gcs.address`. Ray's ``GcsClient``
constructor blocks about 40 s on an unreachable address whatever timeout
it is given, so every read runs under our own deadline (default 5 s), after a TCP connect
check that fails fast on a closed port:

* one-shot reads (the CLI) run ``gcs_read`` as a child process, killed at the deadline
  (:mod:`rayscope.sources.gcs.child`);
* the head agent keeps one in-process client (:class:`GcsReader`) and reads it once per
  interval in a worker thread under the same deadline.
"""

import importlib.util
import os
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import msgspec

from rayscope import errors
from rayscope.defaults import CLUSTER_RAY, DEFAULT_GCS_PORT, DEFAULT_TIMEOUT_S
from rayscope.labels import printable
from rayscope.net.addresses import split_address
from rayscope.net.deadline import Deadline
from rayscope.schema.pending import PendingRead
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import ActorBooking, RayNode
from rayscope.sources.gcs import raycompat
from rayscope.sources.gcs import read as gcs_read
from rayscope.units import seconds

if TYPE_CHECKING:
    from rayscope.net import peer

T = TypeVar("T")


class GcsUnavailable(Exception):
    """The GCS could not be read; ``str()`` is the operator's one-line reason."""


def ray_importable() -> bool:
    return importlib.util.find_spec("ray") is not None


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
    box: list[T] = []
    thread = errors.Worker(lambda: box.append(fn()), "rayscope-gcs")
    busy.append(thread)
    thread.start()
    thread.join(timeout_s)
    if thread.error is not None:  # handed to the caller's thread
        raise thread.error
    if not box:
        raise TimeoutError
    return box[0]


def check_port(address: str, timeout_s: float, deadline: Optional[Deadline] = None) -> "peer.Naming":
    """Fail fast, with the reason, when nothing listens at the GCS address; else the probe
    (:class:`rayscope.net.peer.Naming`) started on the connection made, which tells in the
    background what answers there, within ``deadline`` (default: ``timeout_s`` from now),
    for :func:`not_a_gcs` should the read time out: one deadline for the check, the read and
    the naming, never a probe after it (it overran ``--timeout`` by 1-3.9 s)."""
    from rayscope.net import peer

    deadline = deadline or Deadline(timeout_s)
    host, port = split_address(address)
    try:
        sock = socket.create_connection((host, port), timeout=deadline.need())
    except ConnectionRefusedError:
        raise GcsUnavailable(f"GCS unreachable at {address} (connection refused)") from None
    except (socket.timeout, TimeoutError):
        raise GcsUnavailable(f"GCS unreachable at {address} (timeout {seconds(timeout_s)} s)") from None
    except OSError as err:
        raise GcsUnavailable(f"GCS unreachable at {address} ({err.strerror or type(err).__name__})") from None
    return peer.Naming(sock, host, port, deadline)


def not_a_gcs(address: str, naming: "Optional[peer.Naming]") -> str:
    """When a port took the connection but the GCS read timed out: what answers there if it
    is plainly no GCS (a rayscope head's port, an HTTP or TLS server: :mod:`rayscope.net.peer`,
    told by the port check's probe), as the whole message; ``""`` when it may be a GCS that
    is slow or hung, or the probe could not tell before the deadline."""
    from rayscope.net import peer

    kind = naming.kind() if naming is not None else None
    if kind is None or kind == peer.GRPC:
        return ""
    what = peer.WHAT[kind]
    hint = f" (read it with status --head http://{address})" if kind == peer.HEAD_HTTP else ""
    return f"no GCS at {address}: it is {what}{hint}; Ray's GCS listens on {DEFAULT_GCS_PORT} by default"


def gcs_error_text(err: BaseException, address: str, timeout_s: float, token_source: Optional[str]) -> str:
    """A GCS client error in the operator's words; the error's own text (a peer's: the GCS
    sends it) printable and cut at 300 characters, as it goes to logs and lines."""
    text = str(err)
    lowered = text.lower()
    if isinstance(err, TimeoutError) or "timed out" in lowered or "deadline" in lowered:
        return f"GCS unreachable at {address} (timeout {seconds(timeout_s)} s)"
    if "unauthenticated" in lowered or "authentication" in lowered or "token" in lowered:
        if token_source:
            return f"GCS at {address} rejected the token from {token_source}"
        return (
            f"GCS at {address} requires token authentication:"
            " set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (and RAY_AUTH_MODE=token)"
        )
    first_line = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return f"GCS at {address} failed: {printable(first_line)[:300]}"


class GcsReader:
    """Reads the scheduler's view; keeps its client between reads (the head agent polls)."""

    def __init__(self, address: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._client: Any = None
        self._busy: list[threading.Thread] = []
        self.token_source = gcs_read.prepare_auth_env(os.environ)
        self.versions: Optional[SourceStatus] = None
        """``ray``: the cluster's release and this process's, read once per connection."""
        self.cluster_ray_version: Optional[str] = None
        """The cluster's Ray release as its GCS says it (``None``: unknown), once connected."""

    def read_raw(self) -> list[dict]:  # type: ignore[type-arg]
        """Plain node dicts (``gcs_read``'s format); raises :class:`GcsUnavailable`."""
        if not ray_importable():
            raise GcsUnavailable(f"ray is not importable by this Python ({sys.executable})")
        naming = None
        try:
            deadline = Deadline(self.timeout_s)  # one for the check, connect and read
            if self._client is None:
                naming = check_port(self.address, self.timeout_s, deadline)
                left = remaining_s(deadline, self.address, self.timeout_s)
                self._client = _with_deadline(lambda: gcs_read.connect(self.address), left, self._busy)
                connected = self._client
                left = remaining_s(deadline, self.address, self.timeout_s)
                cluster, why = _with_deadline(
                    lambda: raycompat.cluster_ray_version(connected, left), left, self._busy
                )
                self.versions = ray_versions_status(gcs_read.ray_version(), cluster, why)
                self.cluster_ray_version = cluster
            client = self._client
            left = remaining_s(deadline, self.address, self.timeout_s)
            return _with_deadline(lambda: gcs_read.read_nodes(client, left), left, self._busy)
        except GcsUnavailable:
            raise
        except Exception as err:
            connecting, self._client = self._client is None, None  # reconnect next time
            wrong = not_a_gcs(self.address, naming) if connecting and isinstance(err, TimeoutError) else ""
            why = wrong or gcs_error_text(err, self.address, self.timeout_s, self.token_source)
            raise GcsUnavailable(why) from err

    def read_actors(self) -> tuple[Optional[list[ActorBooking]], SourceStatus]:
        """Every live actor (the head agent's attribution input); never raises."""
        if self._client is None:
            self.read()  # connects, or says why not
        return self._read_more("gcs_actors", gcs_read.read_actors, to_actors)

    def read_pending(self) -> tuple[Optional[PendingRead], SourceStatus]:
        """What waits to be placed (the head agent reads it once per interval); never raises."""
        return self._read_more("gcs_pending", gcs_read.read_pending, to_pending)

    def _read_more(
        self,
        source: str,
        read: Callable[[Any, str, float], object],
        convert: Callable[[object, str], tuple[Optional[T], SourceStatus]],
    ) -> tuple[Optional[T], SourceStatus]:
        """One read beyond the nodes on the connected client, under the deadline, as the
        ``source``'s answer; never raises."""
        client = self._client
        if client is None:
            return None, SourceStatus(name=source, ok=False, reason="GCS not connected")
        try:
            timeout_s = self.timeout_s
            raw = _with_deadline(lambda: read(client, self.address, timeout_s), timeout_s, self._busy)
        except Exception as err:
            reason = gcs_error_text(err, self.address, self.timeout_s, self.token_source)
            return None, SourceStatus(name=source, ok=False, reason=reason)
        return convert(raw, self.address)

    def dashboard_url(self) -> tuple[Optional[str], str]:
        """The address the cluster's dashboard published in the GCS (``raycompat.dashboard_url``
        on this reader's client, under the deadline), or ``(None, why not)``; never raises."""
        client = self._client
        if client is None:
            return None, "GCS not connected"
        timeout_s = self.timeout_s
        try:
            found: tuple[Optional[str], str] = _with_deadline(
                lambda: raycompat.dashboard_url(client, timeout_s), timeout_s, self._busy
            )
        except Exception as err:
            return None, gcs_error_text(err, self.address, self.timeout_s, self.token_source)
        return found

    def read(self) -> tuple[list[RayNode], SourceStatus]:
        """Every node the GCS knows, and the source's status; never raises."""
        try:
            raw = self.read_raw()
        except GcsUnavailable as err:
            return [], SourceStatus(name="gcs", ok=False, reason=str(err), detail=self.address)
        return to_nodes(raw, self.address, f"{self.address} in process")


def to_nodes(raw: object, address: str, detail: str) -> tuple[list[RayNode], SourceStatus]:
    try:
        nodes = msgspec.convert(raw, list[RayNode])
    except msgspec.ValidationError as err:
        return [], SourceStatus(name="gcs", ok=False, reason=f"unexpected GCS answer from {address}: {err}")
    return nodes, SourceStatus(name="gcs", ok=True, detail=detail)


def remaining_s(deadline: Deadline, address: str, timeout_s: float) -> float:
    """Seconds left before ``deadline``: one deadline for the port check and what follows
    it, never one each; :class:`GcsUnavailable` when none is left."""
    left = deadline.left()
    if left <= 0:
        raise GcsUnavailable(f"GCS unreachable at {address} (timeout {seconds(timeout_s)} s)")
    return left


def token_source() -> Optional[str]:
    return gcs_read.prepare_auth_env(dict(os.environ))


def to_actors(raw: object, address: str) -> tuple[Optional[list[ActorBooking]], SourceStatus]:
    try:
        actors = msgspec.convert(raw, list[ActorBooking])
    except msgspec.ValidationError as err:
        reason = f"unexpected actor table from {address}: {err}"
        return None, SourceStatus(name="gcs_actors", ok=False, reason=reason)
    dead = sum(1 for a in actors if a.state == "DEAD")
    detail = f"{len(actors) - dead} live actor(s), {dead} recently dead"
    return actors, SourceStatus(name="gcs_actors", ok=True, detail=detail)


def to_pending(raw: object, address: str) -> tuple[Optional[PendingRead], SourceStatus]:
    try:
        pending = msgspec.convert(raw, PendingRead)
    except msgspec.ValidationError as err:
        return None, SourceStatus(
            name="gcs_pending", ok=False, reason=f"unexpected pending demand from {address}: {err}"
        )
    waiting = sum(r.count for r in pending.requests) + len(pending.gangs)
    return pending, SourceStatus(name="gcs_pending", ok=True, detail=f"{waiting} waiting")


def ray_versions_status(reader: Optional[str], cluster: Optional[str], why_unknown: str) -> SourceStatus:
    """``ray``: the cluster's Ray release and the reader's (the Python that read the GCS).
    Different releases still read (the GCS protocol held across 2.33-2.60), but the
    operator should know; an unknown cluster release is said, never guessed."""
    detail = f"{CLUSTER_RAY}{cluster or 'unknown'}, reader Ray {reader or 'unknown'}"
    if cluster is None:
        reason = f"the cluster's Ray version is unknown: {why_unknown or 'not reported'}"
    elif reader and reader != cluster:
        reason = f"the reader's Ray {reader} differs from the cluster's Ray {cluster}"
    else:
        reason = ""
    return SourceStatus(name="ray", ok=True, reason=reason, detail=detail)
