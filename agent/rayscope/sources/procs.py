"""GPU processes → Ray: which Ray worker (job, actor, node) holds each pid NVML lists.

Raw reads (psutil, the raylet's session logs) and pure parsers the tests feed recorded text:

* the owning worker: the pid itself or the ancestor whose parent is a ``raylet`` process
  that root or this user runs (another user's is not Ray's: SECURITY.md, rule 1);
  the raylet's command line gives the node id and session directory;
* the worker's process title: Ray sets it to ``ray::ClassName`` for an actor,
  ``ray::ServeReplica:app:deployment`` for a Serve replica, ``ray::IDLE`` for an idle worker;
* the job id: Ray names each worker's log ``logs/worker-<worker id>-<job id>-<pid>.out``
  (job ``ffffffff`` for a prestarted worker, whose log then starts with ``:job_id:<hex>``);
* the actor id: the worker's core log says ``Creating actor actor_id=<hex>``.

The NVIDIA driver reports pids of the host's pid namespace. In a container with its own pid
namespace those are not this process's pids: then nothing is mapped, and the status says so
(a wrong mapping would attribute memory to whatever local process shares a number).
"""

import os
import re
from collections.abc import Iterable, Sequence
from typing import Optional

import psutil

from rayscope.schema.report import ProcessInfo, SourceStatus
from rayscope.sources.raylet import RAYLET_NAME, parse_raylet_cmdline, raylet_refusal
from rayscope.units import is_count, parse_count

HOST_PID_NAMESPACE = "pid:[4026531836]"
"""``readlink /proc/self/ns/pid`` in the kernel's initial pid namespace (PROC_PID_INIT_INO)."""
PID_NAMESPACE_LINK = "/proc/self/ns/pid"
CORE_LOG_BYTES = 256 * 1024
"""How much of a worker's core log to read: the actor's creation is among its first lines."""

# Pids in [0-9] (``\d`` takes any script's digits) and converted by units.parse_count.
_WORKER_LOG = re.compile(r"^worker-([0-9a-f]+)-([0-9a-f]+)-([0-9]+)\.(?:out|err)$")
_CORE_LOG = re.compile(r"^python-core-worker-([0-9a-f]+)_([0-9]+)\.log$")
_CREATING_ACTOR = re.compile(r"Creating actor\W+actor_id\W+([0-9a-f]{32})")
_JOB_MARKER = re.compile(r"^:job_id:([0-9a-f]+)$", re.MULTILINE)
NO_JOB = "ffffffff"
"""The job id in the log name of a worker started before any job was given to it."""

CONTAINER_REASON = (
    "not mapped to Ray: rayscope runs in its own pid namespace (a container) and NVML reports"
    " the host's pids (run rayscope on the host, or the container with --pid=host)"
)


def pid_namespace_is_host(link: Optional[str]) -> Optional[bool]:
    """Whether ``readlink /proc/self/ns/pid`` names the host's pid namespace; ``None`` if unknown."""
    if not link:
        return None
    return link == HOST_PID_NAMESPACE


def read_pid_namespace() -> Optional[str]:
    try:
        return os.readlink(PID_NAMESPACE_LINK)
    except OSError:
        return None


def parse_title(cmdline: Sequence[str]) -> Optional[str]:
    """A Ray worker's title from its command line (Ray overwrites argv with it, padded with
    blanks); ``None`` for a process Ray did not title."""
    text = " ".join(cmdline).strip()
    return text if text.startswith("ray::") else None


def parse_worker_log_name(filename: str) -> Optional[tuple[str, str, int]]:
    """``worker-<worker id>-<job id>-<pid>.out`` → (worker id, job id, pid)."""
    match = _WORKER_LOG.match(filename)
    pid = _pid(match.group(3)) if match else None
    return None if match is None or pid is None else (match.group(1), match.group(2), pid)


def parse_core_log_name(filename: str) -> Optional[tuple[str, int]]:
    """``python-core-worker-<worker id>_<pid>.log`` → (worker id, pid)."""
    match = _CORE_LOG.match(filename)
    pid = _pid(match.group(2)) if match else None
    return None if match is None or pid is None else (match.group(1), pid)


def _pid(text: str) -> Optional[int]:
    """A pid from a file name anyone may create in the session directory; ``None`` past 19 digits."""
    return parse_count(text, "pid") if is_count(text) else None


def parse_worker_log_job(text: str) -> Optional[str]:
    """The job a prestarted worker was given: Ray writes ``:job_id:<hex>`` into its ``.out``."""
    match = _JOB_MARKER.search(text)
    return match.group(1) if match else None


def parse_core_log_actor(text: str) -> Optional[str]:
    """The actor a worker created, from the start of its core log; ``None`` if it created none."""
    match = _CREATING_ACTOR.search(text)
    return match.group(1) if match else None


def list_session_logs(logs_dir: Optional[str]) -> tuple[dict[int, tuple[str, str]], dict[int, str]]:
    """A session's ``logs`` directory: (pid → (job id, worker ``.out`` log), pid → core log)."""
    workers: dict[int, tuple[str, str]] = {}
    cores: dict[int, str] = {}
    try:
        names = sorted(os.listdir(logs_dir)) if logs_dir else []
    except OSError:
        names = []
    for name in names:
        worker = parse_worker_log_name(name)
        if worker is not None and name.endswith(".out"):
            workers[worker[2]] = (worker[1], name)
        core = parse_core_log_name(name)
        if core is not None:
            cores[core[1]] = name
    return workers, cores


class _SessionLogs:
    """One raylet's ``<session>/logs`` directory, listed once and only when first needed (a
    long-lived session holds thousands of logs): pid → job id, actor id."""

    def __init__(self, logs_dir: Optional[str]) -> None:
        self.logs_dir = logs_dir
        self._listing: Optional[tuple[dict[int, tuple[str, str]], dict[int, str]]] = None

    def _logs(self) -> tuple[dict[int, tuple[str, str]], dict[int, str]]:
        if self._listing is None:
            self._listing = list_session_logs(self.logs_dir)
        return self._listing

    def _head(self, name: str, size: int) -> str:
        assert self.logs_dir is not None
        try:
            with open(os.path.join(self.logs_dir, name), errors="replace") as f:
                return f.read(size)
        except OSError:
            return ""

    def job_id(self, pid: int) -> Optional[str]:
        job, name = self._logs()[0].get(pid, (None, ""))
        if job == NO_JOB:
            return parse_worker_log_job(self._head(name, 4096))
        return job

    def actor_id(self, pid: int) -> tuple[Optional[str], bool]:
        """(actor id, final): final once found, or once the log is longer than what is read
        (the creation line comes first, so reading again would not find it either)."""
        name = self._logs()[1].get(pid)
        if not name:
            return None, False
        head = self._head(name, CORE_LOG_BYTES)
        actor = parse_core_log_actor(head)
        return actor, actor is not None or len(head) >= CORE_LOG_BYTES


_worker_ids: dict[tuple[int, float], tuple[Optional[str], Optional[str]]] = {}
"""(worker pid, start time) → (job id, actor id), kept once final: a worker runs one job and
hosts at most one actor, so the node agent need not list and read the session logs again on
every cycle (a core log is read up to 256 KiB, for every GPU process)."""


class _Raylets:
    """The raylets met while walking up process trees, each read once."""

    def __init__(self) -> None:
        self._nodes: dict[int, Optional[tuple[Optional[str], _SessionLogs]]] = {}

    def get(self, raylet: "psutil.Process") -> Optional[tuple[Optional[str], _SessionLogs]]:
        """(node id, session logs) of a raylet; ``None`` for one that root or this user does
        not run (SECURITY.md, rule 1: its session directory would be anyone's, a FIFO there
        would hang this read): to rayscope it is no raylet."""
        if raylet.pid not in self._nodes:
            node_id: Optional[str] = None
            logs_dir: Optional[str] = None
            try:
                refused = raylet_refusal(raylet) is not None
            except psutil.Error:  # whose it is cannot be told: nobody's to trust
                refused = True
            if refused:
                self._nodes[raylet.pid] = None
                return None
            try:
                info = parse_raylet_cmdline(raylet.cmdline(), raylet.pid)
            except psutil.Error:
                info = None
            if info is not None:
                node_id = info.node_id
                logs_dir = os.path.join(info.session_dir, "logs") if info.session_dir else None
            self._nodes[raylet.pid] = (node_id, _SessionLogs(logs_dir))
        return self._nodes[raylet.pid]


def describe(pid: int, raylets: _Raylets) -> ProcessInfo:
    """One pid as this host sees it; never raises."""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
        chain = [proc, *proc.parents()]
    except psutil.NoSuchProcess:
        return ProcessInfo(pid=pid, visible=False)
    except psutil.Error:  # access denied: visible, not describable
        return ProcessInfo(pid=pid)
    info = ProcessInfo(pid=pid, name=name)
    for child, parent in zip(chain, chain[1:]):
        try:
            if parent.name() != RAYLET_NAME:
                continue
            raylet = raylets.get(parent)
            if raylet is None:  # another user's "raylet": not Ray's, look further up
                continue
            title = parse_title(child.cmdline())
        except psutil.Error:
            return info
        node_id, logs = raylet
        info.title = title
        info.worker_pid = child.pid
        info.raylet_pid = parent.pid
        info.node_id = node_id
        info.job_id, info.actor_id = _ids(child, logs)
        break
    return info


def _ids(worker: "psutil.Process", logs: _SessionLogs) -> tuple[Optional[str], Optional[str]]:
    """A worker's (job id, actor id), from the cache of final answers or its logs."""
    try:
        key = (worker.pid, worker.create_time())
    except psutil.Error:
        key = None
    if key is not None and key in _worker_ids:
        return _worker_ids[key]
    job = logs.job_id(worker.pid)
    actor, final = logs.actor_id(worker.pid)
    if key is not None and final and job is not None:
        _worker_ids[key] = (job, actor)
    return job, actor


def read_processes(
    pids: Iterable[int], pid_namespace: Optional[str] = None
) -> tuple[Optional[list[ProcessInfo]], SourceStatus]:
    """This host's view of the pids NVML listed; ``None`` where they cannot be this host's
    pids (a container). ``pid_namespace``: ``readlink /proc/self/ns/pid`` (read if not given)."""
    wanted = sorted(set(pids))
    namespace = pid_namespace if pid_namespace is not None else read_pid_namespace()
    if pid_namespace_is_host(namespace) is False:
        return None, SourceStatus(name="procs", ok=False, reason=CONTAINER_REASON, detail=namespace or "")
    raylets = _Raylets()
    infos = [describe(pid, raylets) for pid in wanted]
    workers = {i.worker_pid for i in infos}
    for key in [k for k in _worker_ids if k[0] not in workers]:  # gone workers: keep it bounded
        del _worker_ids[key]
    in_ray = sum(1 for i in infos if i.worker_pid is not None)
    detail = f"{len(infos)} GPU process(es), {in_ray} in Ray"
    if namespace is None:
        detail += "; pid namespace unknown"
    return infos, SourceStatus(name="procs", ok=True, detail=detail)
