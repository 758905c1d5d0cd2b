"""``rayscope usage`` (``/v1/usage``): each actor's measured GPU memory over a window beside
its booking, per actor and per app; and the head's saved history (``head --usage-state``).

Sizes are bytes where measured (``_bytes``) and MiB where booked (``_mb``: Ray's ``VRAM_MB``
is counted in MiB). ``null`` is unknown, never a made-up 0.
"""

from typing import Annotated, Optional

import msgspec

from rayscope.schema.report import Count
from rayscope.schema.status import DOCUMENT_SCHEMA

MAX_SLOTS = 720
"""Slots per series: the window is cut into at most this many, each keeping its maximum."""
MAX_ACTORS = 16_384
"""Actors the head remembers at once (alive and gone); one more is not recorded (counted)."""
MAX_DEVICES_PER_ACTOR = 64
"""GPUs (or MIG instances) one actor is followed on: a report's own bound."""
MAX_SLOT_COUNT = 65_535
"""Samples counted per slot (an ``array('H')``); more in one slot is still one maximum."""
MAX_SECONDS = 2.0**33
"""The bound of every time in the state file, a wall clock (the year 2242) or an age or slot
width (272 years): any real one fits, and no sum or product of them overflows a float."""
MAX_BOOKED = 2.0**53
"""The bound of a booking (MiB or GPUs) in the state file: the largest float that counts
every unit exactly; Ray itself holds at most 2**63 ten-thousandths of a unit (9.2e14)."""


class ActorUsage(msgspec.Struct, kw_only=True):
    """One actor (one replica): what it booked beside what its processes held over the window."""

    actor_id: str
    name: str
    """What the operator calls it (a Serve replica's deployment, else its name, else its class)."""
    class_name: str
    app: str
    """Its group: ``app/deployment`` for a Ray Serve (BioEngine) replica, else its class name."""
    pid: Optional[int] = None
    node_id: str = ""
    job_id: str = ""
    alive: bool = True
    """``False``: gone from the actor table; kept until its last sample leaves the window."""
    booked_vram_mb: float = 0.0
    """Ray's ``VRAM_MB`` it booked (MiB); 0 when it booked none."""
    booked_gpu: float = 0.0
    """Ray's ``GPU`` it booked (device handles, a fraction)."""
    booked_mb: Optional[float] = None
    """Its booking in MiB: ``VRAM_MB`` where it booked any, else its ``GPU`` fraction of its
    device's memory; ``None`` when that device's size is unknown."""
    peak_used_bytes: Optional[int] = None
    """The most its processes held at once over the window (the highest slot); ``None``: no
    measured sample in the window."""
    p95_used_bytes: Optional[int] = None
    """95th percentile (nearest rank) of the per-slot maxima."""
    samples: int = 0
    """Reports that measured it within the window."""
    window_s: float = 0.0
    """Seconds of the window these figures cover (less than asked when the head knows less)."""
    devices: list[str] = []
    """The GPUs it held memory on (NVML UUID, else ``node:index``)."""
    suggested_vram_mb: Optional[int] = None
    """Peak plus headroom, rounded up to 256 MiB; ``None`` with ``reason``."""
    frees_mb: Optional[float] = None
    """``booked_mb - suggested_vram_mb``: negative when it needs more than it booked."""
    oom_risk: bool = False
    """Its peak exceeds its booking: a neighbour booked into the rest can run it out of memory."""
    reason: str = ""
    """Why there is no suggestion (memory not measured here, nothing held, booking unknown)."""


class AppUsage(msgspec.Struct, kw_only=True):
    """The replicas of one app (a Serve deployment or one actor class), per replica."""

    app: str
    replicas: int
    """Replicas alive now (``actors`` counts the gone ones too)."""
    actors: int
    booked_mb: Optional[float] = None
    """Booking per replica in MiB (the largest where replicas differ, ``bookings_differ``)."""
    booked_vram_mb: float = 0.0
    booked_gpu: float = 0.0
    bookings_differ: bool = False
    peak_used_bytes: Optional[int] = None
    """The highest of its replicas' peaks."""
    p95_used_bytes: Optional[int] = None
    """The highest of its replicas' p95s (at least the p95 of all their slots pooled)."""
    samples: int = 0
    suggested_vram_mb: Optional[int] = None
    frees_mb: Optional[float] = None
    """What re-booking its alive replicas at ``suggested_vram_mb`` frees (negative: needs)."""
    oom_risk: bool = False
    reason: str = ""


class UsageDocument(msgspec.Struct, kw_only=True):
    """``rayscope usage --json`` and the head's ``/v1/usage``."""

    schema: int = DOCUMENT_SCHEMA
    generated_at: float
    """Wall clock (epoch seconds) of the answer."""
    window_s: float
    """The window asked (at most the head's ``--usage-window``)."""
    head_window_s: float
    slot_s: float
    """Width of one slot: each keeps the maximum of the samples it got."""
    headroom_pct: float
    known_since: float
    """Wall clock (epoch seconds) since which the head knows (its start, or the oldest
    history it restored from ``--usage-state``)."""
    covered_s: float
    """Seconds of the window the head knows: less than ``window_s`` after a fresh start."""
    restored_from: str = ""
    """The ``--usage-state`` file the history was restored from at start; ``""``: none."""
    actors_read: bool = True
    """``False``: the head has not read the actor table yet: nothing can be attributed."""
    actors_refused: int = 0
    """Actors not recorded because the head held :data:`MAX_ACTORS` already."""
    frees_mb: float = 0.0
    """Cluster-wide: what re-booking every app at its suggestion frees (apps that need
    more are not netted against it)."""
    apps: list[AppUsage] = []
    actors: list[ActorUsage] = []


Slot = Annotated[int, msgspec.Meta(ge=-1, le=2**62)]
"""A slot's maximum in bytes; ``-1``: no sample."""
Slots = Annotated[list[Slot], msgspec.Meta(max_length=MAX_SLOTS)]
SlotCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_SLOT_COUNT)]
"""A slot's sample count."""
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]
Booked = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_BOOKED)]


class SavedDevice(msgspec.Struct, kw_only=True, array_like=True):
    """One device's slots, oldest first, the last one the slot the file was saved in;
    ``-1``: no sample."""

    device: str
    values: Slots
    counts: Annotated[list[SlotCount], msgspec.Meta(max_length=MAX_SLOTS)]


class SavedActor(msgspec.Struct, kw_only=True):
    """One actor of the saved history: who it is, what it booked, its devices' slots."""

    actor_id: str
    name: str = ""
    class_name: str = ""
    pid: Optional[Count] = None
    node_id: str = ""
    job_id: str = ""
    alive: bool = True
    booked_vram_mb: Booked = 0.0
    booked_gpu: Booked = 0.0
    booked_mb: Optional[Booked] = None
    reason: str = ""
    first_seen_s_ago: Seconds = 0.0
    devices: Annotated[list[SavedDevice], msgspec.Meta(max_length=MAX_DEVICES_PER_ACTOR)] = []


class SavedUsage(msgspec.Struct, kw_only=True):
    """The ``--usage-state`` file: written atomically, read once at the head's start."""

    version: int = 1
    saved_at: Seconds
    """Wall clock at the save: the downtime until the next start is counted from it."""
    slot_s: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_SECONDS)]
    known_since: Seconds
    actors: Annotated[list[SavedActor], msgspec.Meta(max_length=MAX_ACTORS)] = []
