"""The one-shot GCS read of the CLI (``status``, ``node``, ``fit``): ``gcs_read`` run as a
child process under a deadline — no thread left blocked in Ray's C++ client, Ray's C++ log
lines kept off the terminal, Ray's import cost and process-wide state kept out of
rayscope's own process — under this Python or, when it cannot import ray, the Ray node's.
"""

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

from rayscope.defaults import DEFAULT_TIMEOUT_S
from rayscope.net import peer_json
from rayscope.net.deadline import Deadline
from rayscope.schema.pending import PendingRead
from rayscope.schema.report import RayletInfo, SourceStatus
from rayscope.schema.status import ActorBooking, RayNode
from rayscope.sources.gcs import prestart as gcs_prestart
from rayscope.sources.gcs import raycompat
from rayscope.sources.gcs import read as gcs_read
from rayscope.sources.gcs import reader as gcs
from rayscope.units import seconds

if TYPE_CHECKING:
    from rayscope.net import peer


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
        f"ray is not importable by this Python ({sys.executable}), and no raylet this user may"
        " use names the Ray node's Python (rayscope node names those refused or unreadable): run"
        " rayscope as root or as the raylet's user, or with a Python that has ray"
    )


def _no_ray_reason_at(address: str, timeout_s: float) -> str:
    """Why no read was tried without ray here, the address's own fault first: nothing
    listening there, or plainly no GCS (a head's port), says so before ray's absence does."""
    try:
        naming = gcs.check_port(address, timeout_s)
    except gcs.GcsUnavailable as err:
        return str(err)
    return gcs.not_a_gcs(address, naming) or _no_ray_reason()


child_script = gcs_prestart.child_script


class Watch(NamedTuple):
    """What a caller gives a read besides its address: the command's one deadline (``None``:
    the read's own, of ``timeout_s``) and a callback for each line of the child's stderr as
    it comes (the dashboard's published address: ``rayscope.sources.dashboard.parallel``)."""

    deadline: Optional[Deadline] = None
    on_line: Optional[Callable[[str], None]] = None


def _run_child(
    address: str, timeout_s: float, python: str, extra: Sequence[str] = (), watch: Optional[Watch] = None
) -> dict[str, Any]:
    """``gcs_read`` as a script under ``python``, the port check and the child under one
    deadline of ``timeout_s`` (``watch.deadline``: the command's, when it gives one): its
    whole JSON answer. Read again with ``import ray`` whole when the light import does not
    work under this Ray (``retry_whole``)."""
    deadline = watch.deadline if watch is not None and watch.deadline is not None else Deadline(timeout_s)
    on_line = watch.on_line if watch is not None else None
    naming = gcs.check_port(address, timeout_s, deadline)
    left = gcs.remaining_s(deadline, address, timeout_s)
    answer = _child_answer(address, timeout_s, python, left, extra, naming, on_line)
    if answer.get("retry_whole"):
        left = gcs.remaining_s(deadline, address, timeout_s)
        answer = _child_answer(address, timeout_s, python, left, (*extra, "whole"), naming, on_line)
    if not answer.get("ok"):
        raise gcs.GcsUnavailable(
            gcs.gcs_error_text(RuntimeError(answer.get("error", "")), address, timeout_s, gcs.token_source())
        )
    return answer


def _child_answer(
    address: str,
    timeout_s: float,
    python: str,
    left: float,
    extra: Sequence[str],
    naming: "Optional[peer.Naming]" = None,
    on_line: Optional[Callable[[str], None]] = None,
) -> dict[str, Any]:
    """One child's JSON answer, under the ``left`` seconds of the read's deadline: the one
    started early (:mod:`gcs_prestart`) when it is the child this read would start.
    ``on_line``: each line of its stderr as it comes (the dashboard's address, early)."""
    source = gcs_prestart.script_for(python)
    words = [address, f"{left:.3f}", *extra]
    started = gcs_prestart.take(python, source) if "whole" not in extra else None
    try:
        if started is not None:
            done = gcs_prestart.finish(started, words, left, on_line)
        else:
            done = gcs_prestart.finish(gcs_prestart.spawn(python, source, words), None, left, on_line)
    except subprocess.TimeoutExpired as err:
        raise gcs.GcsUnavailable(_child_timeout(err, address, timeout_s, python, naming)) from None
    except OSError as err:
        raise gcs.GcsUnavailable(f"cannot run {python} for the GCS read: {err.strerror}") from None
    try:  # the child's json.dump (NaN included) of what the GCS said: peer bytes, nesting bounded
        answer = peer_json.loads(done.stdout)
        if not isinstance(answer, dict):
            raise peer_json.PeerJsonError("not an object")
    except peer_json.PeerJsonError:
        said = [
            line
            for line in done.stderr.strip().splitlines()
            if line != gcs_read.IMPORTED and not line.startswith(gcs_read.DASHBOARD_MARK)
        ]
        last = (said or [f"exit code {done.returncode}"])[-1]
        raise gcs.GcsUnavailable(f"GCS read under {python} failed: {last}") from None
    return answer


def _child_timeout(
    err: subprocess.TimeoutExpired,
    address: str,
    timeout_s: float,
    python: str,
    naming: "Optional[peer.Naming]" = None,
) -> str:
    """Why the child ran past the deadline: the port is plainly no GCS (named when the port
    check's probe told what answers there, ``naming``: no longer wait would help, imported
    or not), still importing ray (a loaded host, a slow filesystem), or waiting on a GCS
    whose port took the connection but did not answer."""
    wrong = gcs.not_a_gcs(address, naming)
    if wrong:
        return wrong
    stderr = err.stderr or b""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    if gcs_read.IMPORTED in text:
        return f"GCS unreachable at {address} (timeout {seconds(timeout_s)} s)"
    return (
        f"GCS read stopped at its deadline (timeout {seconds(timeout_s)} s) while {python} was still"
        " importing ray (a loaded host or a slow file system): the GCS was not asked; raise --timeout"
    )


def read_pending_too(
    address: str,
    timeout_s: float,
    python: Optional[str],
    actors: bool,
    watch: Optional[Watch] = None,
    _answer: Optional[list[Any]] = None,
) -> tuple[list[RayNode], Optional[list[ActorBooking]], Optional[PendingRead], list[SourceStatus]]:
    """:func:`read_cluster` plus what waits to be placed, in the same child process (one
    deadline); the pending demand's status (``gcs_pending``) comes last. ``_answer``: the
    whole answer is appended to it (the dashboard's published address is in it)."""
    box: list[Any] = [] if _answer is None else _answer
    views, booked, statuses = read_cluster(address, timeout_s, python, actors, _answer=box, watch=watch)
    if not box:
        return views, booked, None, statuses
    answer = box[0]
    if "pending" not in answer:
        error = answer.get("pending_error", "no pending demand in the answer")
        reason = gcs.gcs_error_text(RuntimeError(error), address, timeout_s, gcs.token_source())
        return views, booked, None, [*statuses, SourceStatus(name="gcs_pending", ok=False, reason=reason)]
    pending, status = gcs.to_pending(answer["pending"], address)
    return views, booked, pending, [*statuses, status]


def read_cluster(
    address: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    python: Optional[str] = None,
    actors: bool = False,
    _answer: Optional[list[Any]] = None,
    watch: Optional[Watch] = None,
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
    if python == sys.executable and not gcs.ray_importable():
        return (
            [],
            None,
            [
                SourceStatus(
                    name="gcs", ok=False, reason=_no_ray_reason_at(address, timeout_s), detail=address
                )
            ],
        )
    try:
        extra = (["actors"] if actors else []) + (["pending"] if _answer is not None else [])
        answer = _run_child(address, timeout_s, python, extra, watch)
    except gcs.GcsUnavailable as err:
        return [], None, [SourceStatus(name="gcs", ok=False, reason=str(err), detail=address)]
    if _answer is not None:  # read_pending_too takes the rest of the answer
        _answer.append(answer)
    views, status = gcs.to_nodes(answer["nodes"], address, f"{address} via {python}")
    versions = gcs.ray_versions_status(
        answer.get("ray_version"),
        answer.get("cluster_ray_version"),
        answer.get("cluster_ray_version_error", ""),
    )
    if not actors:
        return views, None, [status, versions]
    if "actors" not in answer:
        error = answer.get("actors_error", "no actor table in the answer")
        reason = gcs.gcs_error_text(RuntimeError(error), address, timeout_s, gcs.token_source())
        return views, None, [status, SourceStatus(name="gcs_actors", ok=False, reason=reason), versions]
    booked, actors_status = gcs.to_actors(answer["actors"], address)
    return views, booked, [status, actors_status, versions]
