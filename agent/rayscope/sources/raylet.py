"""The local raylet process(es): who this Ray node is, read from the raylet's command line.

A raw read (:func:`find_raylets`, psutil) and a pure parser (:func:`parse_raylet_cmdline`)
that the tests feed recorded command lines. Only raylets that root or the user running
rayscope runs are read (:func:`raylet_refusal`, SECURITY.md rule 1): anyone can start a
process named ``raylet``. The raylet's command line carries
``--node_id``, ``--node_ip_address``, ``--static_resource_list`` (custom resources and the
GPU count included), ``--gcs-address``, ``--head``, ``--labels`` (JSON) and
``--python_worker_command`` (whose first word is the Ray node's own Python).
"""

import os
import shlex
from collections.abc import Sequence
from typing import Optional

import psutil

from rayscope.net import peer_json
from rayscope.schema.report import RayletInfo, SourceStatus
from rayscope.sources import trust
from rayscope.sources.gcs import raycompat
from rayscope.units import parse_amount

RAYLET_NAME = "raylet"
NOT_RUNNING = frozenset((psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD, psutil.STATUS_STOPPED))
"""A raylet in one of these states serves no node: killed and not yet reaped (zombie), or
stopped (SIGSTOP, a debugger); it counts as not running."""


def _flags(argv: Sequence[str]) -> dict[str, str]:
    """``--key=value`` and bare ``--flag`` arguments, keys with ``-`` folded to ``_``."""
    flags: dict[str, str] = {}
    for arg in argv[1:]:
        if not arg.startswith("--"):
            continue
        key, sep, value = arg[2:].partition("=")
        flags[key.replace("-", "_")] = value if sep else "true"
    return flags


def parse_resource_list(text: str) -> dict[str, float]:
    """``VRAM_MB,24576,CPU,8`` → ``{"VRAM_MB": 24576.0, "CPU": 8.0}``; bad pairs skipped
    (``nan``, ``-1``, ``²``: a report holds finite, non-negative ASCII amounts)."""
    items = text.split(",") if text else []
    resources: dict[str, float] = {}
    for name, value in zip(items[0::2], items[1::2]):
        try:
            resources[name] = parse_amount(value, name)
        except ValueError:
            continue
    return resources


def parse_labels(text: str) -> dict[str, str]:
    """``--labels``: JSON in current Ray, ``k=v,k2=v2`` in some older releases."""
    if not text:
        return {}
    try:
        loaded = peer_json.loads(text)  # the argv of a process that calls itself raylet
    except peer_json.PeerJsonError:
        pairs = (item.partition("=") for item in text.split(","))
        return {k: v for k, sep, v in pairs if sep}
    return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def _first_word(command: str) -> Optional[str]:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return words[0] if words else None


def parse_raylet_cmdline(argv: Sequence[str], pid: int = 0) -> Optional[RayletInfo]:
    """A raylet's identity from its argv; ``None`` if this is not a raylet's command line."""
    if not argv or os.path.basename(argv[0]) != RAYLET_NAME:
        return None
    flags = _flags(argv)
    node_id = flags.get("node_id", "")
    if not node_id:
        return None
    return RayletInfo(
        pid=pid,
        node_id=node_id,
        node_ip=flags.get("node_ip_address", ""),
        is_head=flags.get("head") == "true",
        gcs_address=flags.get("gcs_address") or None,
        session_dir=flags.get("session_dir") or None,
        temp_dir=flags.get("temp_dir") or None,
        static_resources=parse_resource_list(flags.get("static_resource_list", "")),
        labels=parse_labels(flags.get("labels", "")),
        python_executable=_first_word(flags.get("python_worker_command", "")),
    )


CUDA_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def read_gpu_environ(proc: psutil.Process, info: RayletInfo) -> None:
    """The raylet's ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` (``/proc/PID/environ``,
    readable by root and the raylet's own user): Ray's GPU id *i* is entry *i* of the first."""
    try:
        environ = proc.environ()
    except (psutil.Error, OSError):  # another user's raylet: the mapping stays unknown
        return
    info.cuda_visible_devices = environ.get(CUDA_ENV[0])
    info.cuda_device_order = environ.get(CUDA_ENV[1])
    info.environ_read = True


def raylet_refusal(proc: psutil.Process) -> Optional[str]:
    """Why the raylet process ``proc`` is no source of anything for this rayscope (SECURITY.md,
    rule 1): it does not run as root or as this user (real, effective and saved uid: a
    set-uid program started under the name ``raylet`` keeps its caller's real uid). Anyone
    can start a process named ``raylet`` with any command line; its GCS address would get
    root's Ray token, its node id the node agent's reports, its session directory root's
    reads, its Python root's execution."""
    reason = trust.process_refusal(proc.pid, proc.uids(), os.geteuid())
    return f"refused raylet pid {proc.pid}: {reason}" if reason else None


def _read_raylet(proc: psutil.Process) -> tuple[Optional[RayletInfo], list[str]]:
    """One raylet process: its identity when it is trusted, and what was refused (the
    process itself, or the Python it names). Raises ``psutil.Error``."""
    refusal = raylet_refusal(proc)
    argv = proc.cmdline()
    info = parse_raylet_cmdline(argv, proc.pid)
    if info is None:
        return None, []
    if refusal:
        return None, [refusal]
    refused: list[str] = []
    info.started_at = proc.create_time()
    read_gpu_environ(proc, info)
    info.ray_version = raycompat.installed_ray_version(argv[0])
    if info.python_executable:  # SECURITY.md rule 1
        python_refusal = trust.raylet_python_refusal(proc.pid, proc.uids(), info.python_executable)
        if python_refusal:
            info.python_executable = None
            refused.append(python_refusal)
    if not proc.is_running():  # the pid is another process now: what was read may be its
        return None, []
    return info, refused


def find_raylets() -> tuple[list[RayletInfo], SourceStatus]:
    """Every raylet process on this host that root or this user runs, head first then by
    node id; the others are named in the status's reason, and used for nothing."""
    raylets: list[RayletInfo] = []
    refused: list[str] = []
    denied = 0
    for proc in psutil.process_iter(["pid", "name", "status"]):
        if proc.info.get("name") != RAYLET_NAME or proc.info.get("status") in NOT_RUNNING:
            continue
        try:
            info, refusals = _read_raylet(proc)
        except psutil.AccessDenied:
            denied += 1
            continue
        except psutil.Error:  # exited while we looked
            continue
        refused.extend(refusals)
        if info is not None:
            raylets.append(info)
    raylets.sort(key=lambda r: (not r.is_head, r.node_id))
    if raylets:
        detail = ", ".join(f"{r.node_id[:12]} pid {r.pid}" for r in raylets)
        return raylets, SourceStatus(name="raylet", ok=True, detail=detail, reason="; ".join(refused))
    reason = "; ".join(refused) if refused else "no raylet process on this host"
    if denied:
        reason += f" ({denied} raylet(s) not readable: permission denied)"
    return [], SourceStatus(name="raylet", ok=False, reason=reason)


def clusters_here(raylets: Sequence[RayletInfo]) -> str:
    """``raylets of 2 clusters run on this host (10.0.0.1:6379, 10.0.0.2:6379)`` when the
    raylets belong to more than one cluster (by GCS address), else ``""``: which one a
    command means is then the operator's to say, never guessed."""
    addresses = sorted({r.gcs_address for r in raylets if r.gcs_address})
    if len(addresses) < 2:
        return ""
    return f"raylets of {len(addresses)} clusters run on this host ({', '.join(addresses)})"


def pick_raylet(raylets: Sequence[RayletInfo], node_id: Optional[str]) -> Optional[RayletInfo]:
    """The raylet this host reports for: the one pinned by ``node_id`` (a prefix is
    enough), else the head's if it runs here, else the first."""
    if node_id:
        matches = [r for r in raylets if r.node_id.startswith(node_id)]
        return matches[0] if len(matches) == 1 else None
    return raylets[0] if raylets else None


NODE_ID_HEX_DIGITS = 56
"""A Ray node id in hex (28 bytes): what ``ray list nodes`` and ``rayscope node`` print whole."""


def is_full_node_id(text: str) -> bool:
    """Whether ``text`` is a whole Ray node id: 56 lower-case hex digits."""
    return len(text) == NODE_ID_HEX_DIGITS and all(c in "0123456789abcdef" for c in text)


def node_id_mistake(raylets: Sequence[RayletInfo], node_id: str) -> str:
    """Why ``--node-id`` names none of the raylets that run on this host (none has it, or
    several start with it), in one line; ``""`` when one has it, when no raylet runs here
    (a host-only agent, its id the operator's to give), or when it is a whole node id that
    none has (copied on purpose: a node whose raylet runs on another host). Pure."""
    if not raylets:
        return ""
    matches = [r for r in raylets if r.node_id.startswith(node_id)]
    if not matches and is_full_node_id(node_id):
        return ""  # a whole id, copied on purpose: a node whose raylet runs elsewhere (push logs it)
    if len(matches) == 1:
        return ""
    here = ", ".join(f"{r.node_id[:12]} (pid {r.pid})" for r in (matches or raylets))
    if matches:
        return (
            f"--node-id {node_id}: {len(matches)} raylets on this host have ids that start with it"
            f" ({here}): give more of the id"
        )
    return (
        f"--node-id {node_id}: no raylet on this host has that id (here: {here}; a prefix is enough):"
        " pass one of them, or leave --node-id out (`rayscope node` lists them)"
    )


def still_running(info: RayletInfo) -> bool:
    """Whether the raylet ``info`` describes is still the process with its pid, and running
    (not a zombie, not stopped): a cheap check that spares the node agent a scan of every
    process on every cycle."""
    try:
        proc = psutil.Process(info.pid)
        return bool(proc.create_time() == info.started_at) and proc.status() not in NOT_RUNNING
    except psutil.Error:
        return False
