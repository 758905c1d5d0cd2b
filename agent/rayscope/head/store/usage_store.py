"""The head's usage history (``rayscope usage``, ``/v1/usage``): each report's GPU memory,
attributed to actors once per interval, kept in a :class:`~rayscope.core.usage.window.UsageWindow`, saved
to ``--usage-state`` so that a restart keeps it.

The cost on the report path is one call, :meth:`UsageStore.seen` (a list append under the
head's lock it already holds): the reports of an interval wait there, at most
:data:`MAX_PENDING` per node, and :meth:`UsageStore.fold` attributes them in the poller's
thread once per interval (:func:`rayscope.core.gpu.attribution.attribute_node`, the rule ``--gpus``
shows). So every report counts, and a spike held for one report is a peak.

Ages are on the head's monotonic clock; the state file stores ages relative to its save
and the wall clock of the save, so a restart counts the downtime (a wall clock stepped
back counts none) and slots that fell out of the window meanwhile are not restored.
"""

import logging
import math
import os
import stat
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Optional

import msgspec

from rayscope.core.actor_names import actor_name
from rayscope.core.gpu import trust as gpu_trust
from rayscope.core.gpu.attribution import attribute_node, leaf_devices
from rayscope.core.usage.summary import DEFAULT_HEADROOM_PCT, usage_document
from rayscope.core.usage.window import EMPTY, ActorMeta, UsageWindow, slot_width
from rayscope.errors import EXIT_USAGE, AgentError
from rayscope.net import peer_json
from rayscope.schema.report import GpuDevice, NodeReport
from rayscope.schema.status import ActorBooking
from rayscope.schema.usage import SavedActor, SavedDevice, SavedUsage, UsageDocument
from rayscope.sinks.files import write_atomic
from rayscope.units import MIB

log = logging.getLogger("rayscope.head")

DEFAULT_WINDOW_S = 3600.0
MAX_PENDING = 8
"""Reports of one node kept between two folds: an agent faster than the head's interval
has its newest report replace the last one kept beyond this."""
STATE_MODE = 0o600
"""The state file's mode at every save: it holds what ``/v1/usage`` keeps behind the token."""
SAVE_EVERY_S = 60.0
"""How often the history is written to ``--usage-state`` (and once more at shutdown)."""
MAX_STATE_BYTES = 256 * MIB
"""A state file larger than this is refused (a full window of 16,384 actors is ~200 MiB)."""
UNMEASURED_GPU = "NVML did not give this GPU's used memory"
UNMEASURED_PROCESS = "NVML does not give the memory of this GPU's processes"


def _device_key(node_key: str, device: GpuDevice) -> str:
    if device.uuid:
        return device.uuid
    where = device.index if device.parent_index is None else f"{device.parent_index}.{device.index}"
    return f"{node_key}:{where}"


def _meta(actor: ActorBooking, booked_mb: Optional[float]) -> ActorMeta:
    vram = actor.required.get("VRAM_MB", 0.0)
    return ActorMeta(
        actor.actor_id,
        name=actor_name(actor),
        class_name=actor.class_name,
        pid=actor.pid,
        node_id=actor.node_id,
        job_id=actor.job_id,
        booked_vram_mb=vram,
        booked_gpu=actor.required.get("GPU", 0.0),
        booked_mb=vram if vram > 0 else booked_mb,
    )


def report_samples(
    key: str, report: NodeReport, actors: Sequence[ActorBooking], group: Collection[str]
) -> dict[str, tuple[ActorBooking, list[tuple[str, int]], str, Optional[float]]]:
    """One report's figures per actor: (its booking, ``(device, bytes)`` per device measured,
    why a device it is on was not measured, its ``GPU`` fraction as MiB of its devices)."""
    gpus, _ = attribute_node(report.gpus or [], report.processes, actors, group)
    by_id = {a.actor_id: a for a in actors}
    found: dict[str, tuple[ActorBooking, list[tuple[str, int]], str, Optional[float]]] = {}
    for device in leaf_devices(gpus):
        if device.attribution is None:
            continue
        figure = gpu_trust.gpu_used(device)  # the one judge of a GPU's used figure
        for user in device.attribution.users:
            actor = by_id.get(user.actor_id or "")
            if actor is None:
                continue
            used = user.used_memory_bytes
            if not used and actor.node_id != key:
                continue  # placed here by its GPU id only, from a raylet sharing this host
            _, samples, reason, fraction_mb = found.get(actor.actor_id, (actor, [], "", 0.0))
            if fraction_mb is not None and device.memory_total_bytes is not None:
                fraction_mb += (user.booked_gpu or 0.0) * device.memory_total_bytes / MIB
            else:
                fraction_mb = None
            if figure.used_bytes is None:
                reason = reason or figure.reason or UNMEASURED_GPU
            elif used is None:
                reason = reason or UNMEASURED_PROCESS
            else:
                samples.append((_device_key(key, device), used))
            found[actor.actor_id] = (actor, samples, reason, fraction_mb)
    return found


class UsageStore:
    """The window, the reports waiting for the next fold, and the state file; thread-safe
    except :meth:`seen` and :meth:`take`, which run under the head state's lock."""

    def __init__(
        self,
        window_s: float,
        interval_s: float,
        now: float,
        wall_now: float,
        state_file: Optional[str] = None,
    ) -> None:
        self.window = UsageWindow(window_s, slot_width(window_s, interval_s), now)
        self.state_file = state_file
        self.restored_from = ""
        self.actors_read = False
        self.version = 0
        """Moves at each fold and restore: the document is the same until it does (but for
        the ages, which move with the clock)."""
        self._lock = threading.Lock()
        self._pending: dict[str, list[NodeReport]] = {}
        self._saved_at = now
        self._wall_offset = wall_now - now

    def seen(self, key: str, report: NodeReport) -> None:
        """The ingest hook: keep ``report`` for the next fold (only one that lists GPUs)."""
        if report.gpus:
            held = self._pending.get(key)
            if held is None:
                self._pending[key] = [report]
            elif len(held) < MAX_PENDING:
                held.append(report)
            else:
                held[-1] = report

    def take(self) -> dict[str, list[NodeReport]]:
        pending, self._pending = self._pending, {}
        return pending

    def fold(
        self,
        pending: Mapping[str, Sequence[NodeReport]],
        actors: Optional[Sequence[ActorBooking]],
        hosts: Mapping[str, Collection[str]],
        now: float,
    ) -> None:
        """Attribute the reports of the last interval (``hosts``: node key → the nodes
        sharing its host, :func:`rayscope.head.store.state.co_hosted`) and record them at ``now``;
        without an actor table nothing can be attributed (``actors_read`` says so)."""
        by_node: dict[str, list[ActorBooking]] = {}
        for actor in actors or []:
            if actor.state == "ALIVE":
                by_node.setdefault(actor.node_id, []).append(actor)
        found = []
        for key, reports in pending.items():
            group = set(hosts.get(key, ())) | {key}
            candidates = [a for node in sorted(group) for a in by_node.get(node, [])]
            if candidates:
                found += [report_samples(key, r, candidates, group) for r in reports]
        with self._lock:
            self.actors_read = self.actors_read or actors is not None
            for per_actor in found:
                for actor, samples, reason, fraction_mb in per_actor.values():
                    self.window.record(_meta(actor, fraction_mb), samples, now, reason)
            if actors is not None:
                self.window.mark_alive(a.actor_id for a in actors if a.state == "ALIVE")
            self.window.expire(now)
            self.version += 1

    def document(
        self, now: float, window_s: Optional[float] = None, headroom_pct: float = DEFAULT_HEADROOM_PCT
    ) -> UsageDocument:
        with self._lock:
            return usage_document(
                self.window,
                now,
                now + self._wall_offset,
                window_s,
                headroom_pct,
                self.restored_from,
                self.actors_read,
            )

    # --- the state file -------------------------------------------------------------------

    def saved(self, now: float) -> SavedUsage:
        """The window as the state file holds it (each device's slots up to now's)."""
        slot = self.window.slot(now)
        actors = []
        with self._lock:
            for series in self.window.actors.values():
                devices = []
                for name, ring in series.devices.items():
                    values, counts = ring.last(slot, self.window.n)
                    first = next((i for i, v in enumerate(values) if v != EMPTY), len(values))
                    devices.append(SavedDevice(device=name, values=values[first:], counts=counts[first:]))
                m = series.meta
                actors.append(
                    SavedActor(
                        actor_id=m.actor_id,
                        name=m.name,
                        class_name=m.class_name,
                        pid=m.pid,
                        node_id=m.node_id,
                        job_id=m.job_id,
                        alive=m.alive,
                        booked_vram_mb=m.booked_vram_mb,
                        booked_gpu=m.booked_gpu,
                        booked_mb=m.booked_mb,
                        reason=m.reason,
                        first_seen_s_ago=max(0.0, now - series.first_seen),
                        devices=devices,
                    )
                )
            known_since = self.window.known_since + self._wall_offset
        wall = now + self._wall_offset
        return SavedUsage(saved_at=wall, slot_s=self.window.slot_s, known_since=known_since, actors=actors)

    def save(self, now: float) -> None:
        """Write the state file now (atomically: rayscope.cli.output); :class:`AgentError` if it cannot."""
        if self.state_file:
            write_atomic(self.state_file, msgspec.json.encode(self.saved(now)).decode(), STATE_MODE)
            self._saved_at = now

    def maybe_save(self, now: float) -> None:
        """Save when :data:`SAVE_EVERY_S` has passed since the last save; a failure is logged."""
        if self.state_file and now - self._saved_at >= SAVE_EVERY_S:
            try:
                self.save(now)
            except AgentError as err:
                self._saved_at = now  # one warning per period, not one per interval
                log.warning("usage history not saved: %s", err)

    def restore(self, saved: SavedUsage, now: float) -> None:
        """Put a saved history back, ``now`` on the head's clock: each slot at its age at the
        save plus the downtime since (never negative), in this head's slots."""
        downtime = max(0.0, now + self._wall_offset - saved.saved_at)
        slot = self.window.slot(now)
        same_width = saved.slot_s == self.window.slot_s
        shift = math.floor(downtime / self.window.slot_s)  # the downtime in whole slots
        with self._lock:
            for actor in saved.actors:
                meta = ActorMeta(
                    actor.actor_id,
                    name=actor.name,
                    class_name=actor.class_name,
                    pid=actor.pid,
                    node_id=actor.node_id,
                    job_id=actor.job_id,
                    booked_vram_mb=actor.booked_vram_mb,
                    booked_gpu=actor.booked_gpu,
                    booked_mb=actor.booked_mb,
                    reason=actor.reason,
                    alive=actor.alive,
                )
                first_seen = now - downtime - actor.first_seen_s_ago
                for device in actor.devices:
                    if same_width:  # the usual restart: slot for slot, arrays copied whole
                        values, counts = device.values, device.counts
                        self.window.restore_run(meta, first_seen, device.device, slot - shift, values, counts)
                        continue
                    last = len(device.values) - 1
                    slots = [
                        (slot - math.floor(((last - i) * saved.slot_s + downtime) / self.window.slot_s), v, c)
                        for i, (v, c) in enumerate(zip(device.values, device.counts))
                    ]
                    self.window.restore(meta, first_seen, device.device, slots)
            known = now - max(0.0, now + self._wall_offset - saved.known_since)
            self.window.known_since = min(self.window.known_since, known)
            self.window.expire(now)
            self.version += 1


_SAVED = peer_json.Decoder(SavedUsage)


def read_state(path: str) -> Optional[SavedUsage]:
    """The state file at ``path``; ``None`` when there is none yet, or it is not one, a value
    past its bound included (logged: the history starts empty and the file is replaced at the
    next save). :class:`AgentError` (exit 2) for a file rayscope must not read: a symlink,
    not a regular file, another user's, writable by group or others (as a token file is
    refused, agent/rayscope/net/tokens.py), larger than :data:`MAX_STATE_BYTES`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise AgentError(f"cannot read --usage-state {path}: {err.strerror or err}", EXIT_USAGE) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()):
        os.close(fd)
        raise AgentError(
            f"cannot read --usage-state {path}: not a regular file of root or uid {os.geteuid()}",
            EXIT_USAGE,
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        mode = stat.S_IMODE(st.st_mode)
        raise AgentError(
            f"cannot read --usage-state {path}: it is writable by group or others (mode {mode:03o}):"
            f" `chmod 600 {path}`",
            EXIT_USAGE,
        )
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_STATE_BYTES:
            too_big = f"--usage-state {path} is larger than {MAX_STATE_BYTES // MIB} MiB"
            raise AgentError(too_big, EXIT_USAGE)
        data = f.read(st.st_size + 1)  # not MAX_STATE_BYTES: read(n) allocates n at once
    try:
        return _SAVED.decode(data)
    except peer_json.PeerJsonError as err:
        log.warning("--usage-state %s is not a usage history (%s): starting an empty one", path, err)
        return None


def open_store(
    window_s: float, interval_s: float, state_file: Optional[str], now: float, wall_now: float
) -> UsageStore:
    """The head's store: restored from ``state_file`` where it holds a history, and saved at
    once, so that a file that cannot be written stops the head at its start, not an hour in."""
    store = UsageStore(window_s, interval_s, now, wall_now, state_file)
    if state_file:
        saved = read_state(state_file)
        if saved is not None:
            store.restore(saved, now)
            store.restored_from = state_file
            log.info("usage history restored from %s: %d actors", state_file, len(store.window.actors))
        store.save(now)
    return store
