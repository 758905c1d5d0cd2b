"""What ``rayscope usage`` says: per actor and per app, the peak and p95 of what it held over
the window beside its booking, and the booking to ask for.

Pure: a :class:`~rayscope.core.usage.window.UsageWindow` and the clock in, a
:class:`~rayscope.schema.usage.UsageDocument` out. The rules, in the operator's words:

* **peak**: the highest slot of the window (each slot keeps the most its processes held in
  any report of that slot), so a spike of one report is never averaged away;
* **p95**: the 95th percentile, by nearest rank, of the slots that had a sample;
* **suggested booking**: peak plus ``headroom_pct``, rounded up to :data:`STEP_MB` (256
  MiB); none where the latest report could not measure the actor (a vGPU guest without a
  CUDA sample: the reason instead), where it held nothing in the window, or where it was
  never measured;
* **frees**: booking minus suggestion, per replica and, for an app, summed over its alive
  replicas (negative: it needs more); **OOM risk**: the peak exceeds the booking.

An app is Ray's own identity of one (:func:`rayscope.core.actor_names.app_key`): a Ray Serve
deployment (``app/deployment``: a BioEngine app is a Serve application), else the actor's
class with its name less a trailing ``-N`` (an anonymous actor: its class).
"""

import functools
import math
from collections.abc import Sequence
from typing import Optional

from rayscope.core.actor_names import AppKey, app_key, app_labels, app_name, short_class_name
from rayscope.core.limits import HEADROOM
from rayscope.core.usage.window import EMPTY, ActorSeries, UsageWindow, slot_count
from rayscope.schema.usage import ActorUsage, AppUsage, UsageDocument
from rayscope.units import MIB, parse_amount

STEP_MB = 256
"""Suggestions are rounded up to this many MiB: what an operator would type, and a margin."""
DEFAULT_HEADROOM_PCT = 10.0
PERCENTILE = 95
NOT_HELD = "held no GPU memory in the window: nothing to size it by"
MAX_HEADROOM_PCT = HEADROOM.high
MAX_WINDOW_S = 31 * 86_400.0
"""The longest window a head keeps (a month): longer is a typo."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
NOT_MEASURED = "no measured sample in the window"


def parse_window(text: str) -> float:
    """``3600``, ``90s``, ``30m``, ``1h``, ``7d`` or ``1w`` as seconds, in (0, a month];
    ``ValueError`` naming what is wrong."""
    spec = text.strip().lower()
    scale = _UNITS.get(spec[-1:], 0)
    try:
        number = parse_amount(spec[:-1] if scale else spec, "window")
    except ValueError:
        raise ValueError(f"{text!r} is not a window (3600, 90s, 30m, 1h, 7d)") from None
    seconds = number * (scale or 1)
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_WINDOW_S:
        raise ValueError(f"window must be more than 0 and at most 31 days, not {text!r}")
    return seconds


def checked_headroom(pct: float) -> float:
    """A headroom in percent, in [0, 1000]; ``ValueError`` otherwise."""
    if not math.isfinite(pct) or not 0 <= pct <= MAX_HEADROOM_PCT:
        raise ValueError(f"headroom must be from 0 to {MAX_HEADROOM_PCT:g} percent, not {pct:g}")
    return pct


def nearest_rank(values: Sequence[int], percentile: float = PERCENTILE) -> Optional[int]:
    """The ``percentile``-th value by nearest rank (the smallest value with at least that
    share of the values at or below it); ``None`` for no values."""
    if not values:
        return None
    return sorted(values)[max(1, math.ceil(percentile / 100 * len(values))) - 1]


def suggestion_mb(peak_bytes: int, headroom_pct: float) -> int:
    """``peak_bytes`` plus ``headroom_pct`` percent, in MiB, rounded up to :data:`STEP_MB`
    (exact: no float rounding pushes an exact multiple to the next step)."""
    numerator, denominator = _exact(headroom_pct)
    wanted = peak_bytes * (100 * denominator + numerator)  # bytes x 100 x denominator
    return -(-wanted // (100 * denominator * STEP_MB * MIB)) * STEP_MB


@functools.lru_cache(maxsize=64)
def _exact(pct: float) -> tuple[int, int]:
    """``pct`` as the fraction an operator meant (``10.1``: 101/10), once per value: a
    ``Fraction`` per actor cost 40 ms of a 1,000-actor document."""
    from fractions import Fraction  # off the CLI's fast path (options import this module)

    exact = Fraction(pct).limit_denominator(1_000_000)
    return exact.numerator, exact.denominator


def actor_usage(
    series: ActorSeries, now: float, window: UsageWindow, k: int, headroom_pct: float
) -> ActorUsage:
    """One actor over the last ``k`` slots."""
    meta = series.meta
    totals, samples = series.slots(window.slot(now), k)
    measured = totals if EMPTY not in totals else [v for v in totals if v != EMPTY]
    peak = max(measured) if measured else None
    since = max(series.first_seen, window.known_since, now - k * window.slot_s)
    usage = ActorUsage(
        actor_id=meta.actor_id,
        name=meta.name or short_class_name(meta.class_name) or "actor",
        class_name=meta.class_name,
        app=app_name(meta.class_name, meta.name),
        pid=meta.pid,
        node_id=meta.node_id,
        job_id=meta.job_id,
        alive=meta.alive,
        booked_vram_mb=meta.booked_vram_mb,
        booked_gpu=meta.booked_gpu,
        booked_mb=meta.booked_mb,
        peak_used_bytes=peak,
        p95_used_bytes=nearest_rank(measured),
        samples=samples,
        window_s=round(max(0.0, now - since), 1),
        devices=sorted(series.devices),
    )
    usage.reason = meta.reason or (NOT_MEASURED if peak is None else NOT_HELD if peak == 0 else "")
    if peak is not None and meta.booked_mb is not None:
        usage.oom_risk = peak > meta.booked_mb * MIB
    if not usage.reason and peak is not None:
        usage.suggested_vram_mb = suggestion_mb(peak, headroom_pct)
        if meta.booked_mb is not None:
            usage.frees_mb = round(meta.booked_mb - usage.suggested_vram_mb, 1)
    return usage


def app_usage(app: str, actors: Sequence[ActorUsage], headroom_pct: float) -> AppUsage:
    """The replicas of one app, per replica: the largest booking, peak and p95 (the worst
    replica's: at least the p95 of all their slots pooled), one suggestion for all, and
    what re-booking the alive ones at it frees."""
    alive = [a for a in actors if a.alive]
    booked = [a.booked_mb for a in actors if a.booked_mb is not None]
    peaks = [a.peak_used_bytes for a in actors if a.peak_used_bytes is not None]
    p95s = [a.p95_used_bytes for a in actors if a.p95_used_bytes is not None]
    largest = max(actors, key=lambda a: a.booked_mb or 0.0)
    group = AppUsage(
        app=app,
        replicas=len(alive),
        actors=len(actors),
        booked_mb=max(booked) if booked else None,
        booked_vram_mb=largest.booked_vram_mb,
        booked_gpu=largest.booked_gpu,
        bookings_differ=len(set(booked)) > 1,
        peak_used_bytes=max(peaks) if peaks else None,
        p95_used_bytes=max(p95s) if p95s else None,
        samples=sum(a.samples for a in actors),
        oom_risk=any(a.oom_risk for a in actors),
    )
    unmeasured = [a for a in actors if a.reason and a.reason not in (NOT_HELD, NOT_MEASURED)]
    if unmeasured:
        group.reason = f"{len(unmeasured)} of {len(actors)} replica(s) not measured: {unmeasured[0].reason}"
    elif group.peak_used_bytes is None:
        group.reason = NOT_MEASURED
    elif group.peak_used_bytes == 0:
        group.reason = NOT_HELD
    else:
        group.suggested_vram_mb = suggestion_mb(group.peak_used_bytes, headroom_pct)
        if all(a.booked_mb is not None for a in alive):
            group.frees_mb = round(sum((a.booked_mb or 0.0) - group.suggested_vram_mb for a in alive), 1)
    return group


def usage_document(
    window: UsageWindow,
    now: float,
    wall_now: float,
    window_s: Optional[float] = None,
    headroom_pct: float = DEFAULT_HEADROOM_PCT,
    restored_from: str = "",
    actors_read: bool = True,
) -> UsageDocument:
    """The document for the last ``window_s`` seconds (default and at most the whole
    window) as of ``now`` (``wall_now``: the wall clock then, for the times it shows)."""
    asked = window.window_s if window_s is None else min(window_s, window.window_s)
    k = slot_count(asked, window.slot_s)
    actors: list[ActorUsage] = []
    by_app: dict[AppKey, list[ActorUsage]] = {}
    for series in window.actors.values():
        if series.last_slot <= window.slot(now) - k:
            continue  # not seen in the window asked (a shorter one than the head's)
        usage = actor_usage(series, now, window, k, headroom_pct)
        actors.append(usage)
        by_app.setdefault(app_key(series.meta.class_name, series.meta.name), []).append(usage)
    labels = app_labels(by_app)
    for key, members in by_app.items():
        for usage in members:
            usage.app = labels[key]
    apps = [app_usage(labels[key], members, headroom_pct) for key, members in by_app.items()]
    apps.sort(key=lambda a: (-(a.frees_mb or 0.0), a.app))
    actors.sort(key=lambda a: (a.app, a.name, a.actor_id))
    covered = max(0.0, min(asked, now - window.known_since))
    return UsageDocument(
        generated_at=wall_now,
        window_s=asked,
        head_window_s=window.window_s,
        slot_s=window.slot_s,
        headroom_pct=headroom_pct,
        known_since=wall_now - (now - window.known_since),
        covered_s=round(covered, 1),
        restored_from=restored_from,
        actors_read=actors_read,
        actors_refused=window.refused,
        frees_mb=round(sum(a.frees_mb for a in apps if a.frees_mb is not None and a.frees_mb > 0), 1),
        apps=apps,
        actors=actors,
    )
