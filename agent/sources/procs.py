"""GPU processes → Ray: which Ray worker (job, actor, node) holds each pid NVML lists.

Raw reads (psutil, the raylet's session logs) and pure parsers the tests feed recorded text:

* the owning worker: the pid itself or the ancestor whose parent is a ``raylet`` process;
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

from agent.model import ProcessInfo, SourceStatus
from agent.sources.raylet import RAYLET_NAME, parse_raylet_cmdline

HOST_PID_NAMESPACE = "pid:[4026531836]"
"""``readlink /proc/self/ns/pid`` in the kernel's initial pid namespace (PROC_PID_INIT_INO)."""
PID_NAMESPACE_LINK = "/proc/self/ns/pid"
CORE_LOG_BYTES = 256 * 1024
"""How much of a worker's core log to read: the actor's creation is among its first lines."""

_WORKER_LOG = re.compile(r"^worker-([0-9a-f]+)-([0-9a-f]+)-(\d+)\.(?:out|err)$")
_CORE_LOG = re.compile(r"^python-core-worker-([0-9a-f]+)_(\d+)\.log$")
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
    if match is None:
        return None
    return match.group(1), match.group(2), int(match.group(3))


def parse_core_log_name(filename: str) -> Optional[tuple[str, int]]:
    """``python-core-worker-<worker id>_<pid>.log`` → (worker id, pid)."""
    match = _CORE_LOG.match(filename)
    return (match.group(1), int(match.group(2))) if match else None


def parse_worker_log_job(text: str) -> Optional[str]:
    """The job a prestarted worker was given: Ray writes ``:job_id:<hex>`` into its ``.out``."""
    match = _JOB_MARKER.search(text)
    return match.group(1) if match else None


def parse_core_log_actor(text: str) -> Optional[str]:
    """The actor a worker created, from the start of its core log; ``None`` if it created none."""
    match = _CREATING_ACTOR.search(text)
    return match.group(1) if match else None


class _SessionLogs:
    """One raylet's ``<session>/logs`` directory, listed once: pid → job id, actor id."""

    def __init__(self, logs_dir: Optional[str]) -> None:
        self.logs_dir = logs_dir
        self.worker_logs: dict[int, tuple[str, str]] = {}
        self.core_logs: dict[int, str] = {}
        if logs_dir is None:
            return
        try:
            names = sorted(os.listdir(logs_dir))
        except OSError:
            return
        for name in names:
            worker = parse_worker_log_name(name)
            if worker is not None and name.endswith(".out"):
                self.worker_logs[worker[2]] = (worker[1], name)
            core = parse_core_log_name(name)
            if core is not None:
                self.core_logs[core[1]] = name

    def _head(self, name: str, size: int) -> str:
        assert self.logs_dir is not None
        try:
            with open(os.path.join(self.logs_dir, name), errors="replace") as f:
                return f.read(size)
        except OSError:
            return ""

    def job_id(self, pid: int) -> Optional[str]:
        job, name = self.worker_logs.get(pid, (None, ""))
        if job == NO_JOB:
            return parse_worker_log_job(self._head(name, 4096))
        return job

    def actor_id(self, pid: int) -> Optional[str]:
        name = self.core_logs.get(pid)
        return parse_core_log_actor(self._head(name, CORE_LOG_BYTES)) if name else None


class _Raylets:
    """The raylets met while walking up process trees, each read once."""

    def __init__(self) -> None:
        self._nodes: dict[int, tuple[Optional[str], _SessionLogs]] = {}

    def get(self, raylet: "psutil.Process") -> tuple[Optional[str], _SessionLogs]:
        if raylet.pid not in self._nodes:
            node_id: Optional[str] = None
            logs_dir: Optional[str] = None
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
            title = parse_title(child.cmdline())
        except psutil.Error:
            return info
        node_id, logs = raylets.get(parent)
        info.title = title
        info.worker_pid = child.pid
        info.raylet_pid = parent.pid
        info.node_id = node_id
        info.job_id = logs.job_id(child.pid)
        info.actor_id = logs.actor_id(child.pid)
        break
    return info


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
    in_ray = sum(1 for i in infos if i.worker_pid is not None)
    detail = f"{len(infos)} GPU process(es), {in_ray} in Ray"
    if namespace is None:
        detail += "; pid namespace unknown"
    return infos, SourceStatus(name="procs", ok=True, detail=detail)
