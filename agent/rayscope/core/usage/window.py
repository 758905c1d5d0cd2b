"""The usage window: per actor and per GPU, the most its processes held in each slot of a
window, in memory that does not grow with time.

Pure: no I/O, and the clock is a parameter (``now``: seconds on one monotonic clock). The
window of ``window_s`` is cut into ``n`` slots of ``slot_s`` (:func:`slot_width`: one head
interval, or wider so that ``n`` stays at most :data:`MAX_SLOTS`); slot ``s`` covers
``[s * slot_s, (s + 1) * slot_s)``. Each device of an actor keeps a ring of ``n`` slots
(:class:`SlotRing`): the maximum of the samples that fell in each slot and how many there
were. A sample older than the window is dropped; an actor whose last sample has left the
window is forgotten (:meth:`UsageWindow.expire`). Memory is bounded by :data:`MAX_ACTORS`
× devices × ``n`` × 10 bytes, whatever the uptime.

An actor's figure for a slot is the sum over its devices of their maxima there: for the
usual one-GPU replica exactly what it held at its peak in that slot, for a multi-GPU one an
upper bound. :mod:`rayscope.core.usage.summary` turns the slots into peaks, percentiles and
suggestions.
"""

import math
from array import array
from collections.abc import Iterable, Sequence
from typing import Optional

from rayscope.schema.usage import MAX_ACTORS, MAX_DEVICES_PER_ACTOR, MAX_SLOT_COUNT, MAX_SLOTS

COUNT_MAX = MAX_SLOT_COUNT
"""Samples counted per slot (``array('H')``); more in one slot is still one maximum."""
EMPTY = -1
"""A slot's value when no sample fell in it."""


def slot_width(window_s: float, interval_s: float) -> float:
    """Seconds per slot: the head's interval (one report per node per slot), or wider, so a
    window of ``window_s`` takes at most :data:`MAX_SLOTS` slots."""
    return max(interval_s, window_s / MAX_SLOTS)


def slot_count(window_s: float, slot_s: float) -> int:
    """Slots that cover ``window_s`` (at least 1, at most :data:`MAX_SLOTS`)."""
    return max(1, min(MAX_SLOTS, math.ceil(window_s / slot_s - 1e-9)))


class SlotRing:
    """One device of one actor: per slot the largest sample (bytes) and the sample count, in
    a ring of ``n`` slots whose newest is ``newest``."""

    __slots__ = ("counts", "newest", "values")

    def __init__(self, n: int) -> None:
        self.values = array("q", [EMPTY]) * n
        self.counts = array("H", [0]) * n
        self.newest: Optional[int] = None

    def advance(self, slot: int) -> None:
        """Make ``slot`` the newest: the slots between the old newest and it are emptied."""
        n = len(self.values)
        if self.newest is not None and slot <= self.newest:
            return
        if self.newest is None or slot - self.newest >= n:
            self.values = array("q", [EMPTY]) * n
            self.counts = array("H", [0]) * n
        else:
            for s in range(self.newest + 1, slot + 1):
                self.values[s % n] = EMPTY
                self.counts[s % n] = 0
        self.newest = slot

    def add(self, slot: int, value: int, count: int = 1) -> bool:
        """Keep ``value`` (bytes) in ``slot``: the slot keeps its maximum. ``False`` (and
        nothing kept) for a slot already out of the window."""
        n = len(self.values)
        self.advance(slot)
        assert self.newest is not None
        if slot <= self.newest - n:
            return False
        i = slot % n
        self.values[i] = max(self.values[i], value)
        self.counts[i] = min(COUNT_MAX, self.counts[i] + count)
        return True

    def fill(self, newest: int, values: Sequence[int], counts: Sequence[int]) -> None:
        """An empty ring given its slots ending at ``newest`` (at most ``n``, oldest first),
        copied whole; a slot without a sample (:data:`EMPTY`) counts none."""
        n = len(self.values)
        kept_values, kept_counts = array("q", values), array("H", counts)
        if EMPTY in kept_values:
            for i, value in enumerate(kept_values):
                if value == EMPTY:
                    kept_counts[i] = 0
        at = (newest - len(kept_values) + 1) % n
        split = min(len(kept_values), n - at)  # the run may wrap round the ring's end
        for ring, kept in ((self.values, kept_values), (self.counts, kept_counts)):
            ring[at : at + split] = kept[:split]
            ring[: len(kept) - split] = kept[split:]
        self.newest = newest

    def last(self, slot: int, k: int) -> tuple[list[int], list[int]]:
        """Values and counts of the ``k`` slots ending at ``slot`` (the ring is first advanced
        to it), oldest first; :data:`EMPTY` and 0 where no sample fell."""
        n = len(self.values)
        self.advance(slot)
        k = min(k, n)
        start = (slot - k + 1) % n
        if start + k <= n:
            return self.values[start : start + k].tolist(), self.counts[start : start + k].tolist()
        tail = n - start
        values = self.values[start:].tolist() + self.values[: k - tail].tolist()
        return values, self.counts[start:].tolist() + self.counts[: k - tail].tolist()


class ActorMeta:
    """Who an actor is and what it booked, as last seen (the actor table and its report)."""

    __slots__ = (
        "actor_id",
        "alive",
        "booked_gpu",
        "booked_mb",
        "booked_vram_mb",
        "class_name",
        "job_id",
        "name",
        "node_id",
        "pid",
        "reason",
    )

    def __init__(
        self,
        actor_id: str,
        *,
        name: str = "",
        class_name: str = "",
        pid: Optional[int] = None,
        node_id: str = "",
        job_id: str = "",
        booked_vram_mb: float = 0.0,
        booked_gpu: float = 0.0,
        booked_mb: Optional[float] = None,
        reason: str = "",
        alive: bool = True,
    ) -> None:
        self.actor_id, self.name, self.class_name, self.pid = actor_id, name, class_name, pid
        self.node_id, self.job_id, self.alive = node_id, job_id, alive
        self.booked_vram_mb, self.booked_gpu, self.booked_mb = booked_vram_mb, booked_gpu, booked_mb
        self.reason = reason
        """Why its latest sample was not measured (a vGPU guest, NVML without per-process
        memory); ``""`` when it was."""


class ActorSeries:
    """One actor in the window: its latest facts, one ring per device, first and last seen."""

    __slots__ = ("devices", "first_seen", "last_slot", "meta")

    def __init__(self, meta: ActorMeta, first_seen: float, slot: int) -> None:
        self.meta = meta
        self.devices: dict[str, SlotRing] = {}
        self.first_seen = first_seen
        self.last_slot = slot

    def slots(self, slot: int, k: int) -> tuple[list[int], int]:
        """Per slot of the ``k`` ending at ``slot``, the sum of its devices' maxima
        (:data:`EMPTY` where none had a sample), oldest first; and the samples in them (per
        slot the most any device counted: one report measures every device)."""
        rings = list(self.devices.values())
        if not rings:
            return [], 0
        totals, counts = rings[0].last(slot, k)
        for ring in rings[1:]:
            values, more = ring.last(slot, k)
            for i, value in enumerate(values):
                if value != EMPTY:
                    totals[i] = value if totals[i] == EMPTY else totals[i] + value
                counts[i] = max(counts[i], more[i])
        return totals, sum(counts)


class UsageWindow:
    """Every actor's series over ``window_s`` in slots of ``slot_s``; ``now`` names the clock."""

    def __init__(self, window_s: float, slot_s: float, now: float) -> None:
        self.window_s, self.slot_s = window_s, slot_s
        self.n = slot_count(window_s, slot_s)
        self.actors: dict[str, ActorSeries] = {}
        self.known_since = now
        """The clock's time since which the window knows (its start, or restored history)."""
        self.refused = 0
        """Actors not recorded: :data:`MAX_ACTORS` were held."""

    def slot(self, now: float) -> int:
        return math.floor(now / self.slot_s)

    def _series(self, meta: ActorMeta, now: float) -> Optional[ActorSeries]:
        series = self.actors.get(meta.actor_id)
        if series is None:
            if len(self.actors) >= MAX_ACTORS:
                self.refused += 1
                return None
            series = self.actors[meta.actor_id] = ActorSeries(meta, now, self.slot(now))
        return series

    def record(
        self, meta: ActorMeta, samples: Iterable[tuple[str, int]], now: float, reason: str = ""
    ) -> bool:
        """One report's figures for one actor: ``(device, bytes held there)`` per device it
        was measured on, at ``now``; ``reason``: why a device it is on was not measured
        (then it gets no suggestion while its latest report says so). ``False`` when the
        actor could not be recorded (the window is full)."""
        series = self._series(meta, now)
        if series is None:
            return False
        slot = self.slot(now)
        meta.reason = reason
        series.meta = meta
        series.last_slot = max(series.last_slot, slot)
        for device, used in samples:
            ring = series.devices.get(device)
            if ring is None:
                if len(series.devices) >= MAX_DEVICES_PER_ACTOR:
                    continue
                ring = series.devices[device] = SlotRing(self.n)
            ring.add(slot, used)
        return True

    def restore(
        self, meta: ActorMeta, first_seen: float, device: str, slots: Sequence[tuple[int, int, int]]
    ) -> None:
        """Saved slots of one device of one actor: ``(slot, value, count)`` on this clock.
        Slots without a sample are skipped; a device with none allocates nothing (a ring is
        :data:`MAX_SLOTS` slots, allocated whole), nor does an actor."""
        slots = sorted(s for s in slots if s[1] != EMPTY)
        if not slots:
            return
        series = self._series(meta, first_seen)
        if series is None:
            return
        series.first_seen = min(series.first_seen, first_seen)
        ring = series.devices.get(device)
        if ring is None:
            if len(series.devices) >= MAX_DEVICES_PER_ACTOR:
                return
            ring = series.devices[device] = SlotRing(self.n)
        for slot, value, count in slots:
            if ring.add(slot, value, count):
                series.last_slot = max(series.last_slot, slot)

    def restore_run(
        self,
        meta: ActorMeta,
        first_seen: float,
        device: str,
        last_slot: int,
        values: Sequence[int],
        counts: Sequence[int],
    ) -> None:
        """Saved slots of one device of one actor, one per slot, oldest first, the last one
        at ``last_slot``: what :meth:`restore` keeps of them, copied into the ring's arrays
        whole (a full window of 1,000 actors: 720,000 slots, 2.4 s one at a time). A device
        the actor already has, or counts that do not match the values, go slot by slot."""
        newest = len(values) - 1
        while newest >= 0 and values[newest] == EMPTY:
            newest -= 1
        if newest < 0:
            return  # no sample: nothing allocated, as :meth:`restore`
        series = self.actors.get(meta.actor_id)
        if len(counts) != len(values) or (series is not None and device in series.devices):
            first = last_slot - len(values) + 1
            slots = [(first + i, value, count) for i, (value, count) in enumerate(zip(values, counts))]
            self.restore(meta, first_seen, device, slots)
            return
        series = self._series(meta, first_seen)
        if series is None or len(series.devices) >= MAX_DEVICES_PER_ACTOR:
            return
        series.first_seen = min(series.first_seen, first_seen)
        start = max(0, newest - self.n + 1)  # older ones fell out of the window
        newest_slot = last_slot - (len(values) - 1 - newest)
        ring = series.devices[device] = SlotRing(self.n)
        ring.fill(newest_slot, values[start : newest + 1], counts[start : newest + 1])
        series.last_slot = max(series.last_slot, newest_slot)

    def mark_alive(self, alive: Iterable[str]) -> None:
        """The actor table as read now: every other actor is gone (kept for the window)."""
        ids = set(alive)
        for actor_id, series in self.actors.items():
            series.meta.alive = actor_id in ids

    def expire(self, now: float) -> list[str]:
        """Forget the actors whose last sample has left the window; their ids."""
        oldest = self.slot(now) - self.n
        gone = [a for a, s in self.actors.items() if s.last_slot <= oldest]
        for actor_id in gone:
            del self.actors[actor_id]
        return gone
