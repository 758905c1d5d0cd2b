"""``rayscope usage``: lines, JSON, and the per-app families ``/metrics`` adds.

Sizes are MiB labelled ``MB``, as Ray's ``VRAM_MB`` bookings are, so that a peak reads
against its booking digit for digit; the JSON keeps the bytes.
"""

import datetime
from collections.abc import Callable
from typing import Optional

import msgspec

from rayscope.labels import printable
from rayscope.render.metrics import family, label_value
from rayscope.schema.usage import ActorUsage, AppUsage, UsageDocument
from rayscope.units import MIB


def usage_json(doc: UsageDocument) -> str:
    return msgspec.json.format(msgspec.json.encode(doc).decode(), indent=2)


def span(seconds: float) -> str:
    """``1 h``, ``2 h 5 m``, ``14 s``: a duration for reading."""
    whole = round(seconds)
    parts = [(whole // 86_400, "d"), (whole % 86_400 // 3600, "h"), (whole % 3600 // 60, "m")]
    parts.append((whole % 60, "s"))
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


def mb(value: Optional[float]) -> str:
    return "NA" if value is None else f"{value:.0f} MB"


def mb_of_bytes(value: Optional[int]) -> str:
    return "NA" if value is None else f"{value / MIB:.0f} MB"


def booked(row: "ActorUsage | AppUsage") -> str:
    """``booked 5120 MB``, ``booked 0.33 GPU (5069 MB)``, or ``booked nothing``."""
    if row.booked_vram_mb > 0:
        return f"booked {row.booked_vram_mb:.0f} MB"
    if row.booked_gpu > 0:
        return f"booked {row.booked_gpu:.2f} GPU ({mb(row.booked_mb)})"
    return "booked nothing"


def verdict(row: "ActorUsage | AppUsage") -> str:
    """``suggest 2304 MB (frees 2816 MB)``, ``... (needs 768 MB more)  OOM risk: ...``, or
    ``no suggestion: <reason>``."""
    if row.suggested_vram_mb is None:
        text = f"no suggestion: {row.reason}"
    else:
        text = f"suggest {row.suggested_vram_mb} MB"
        if row.frees_mb is not None and row.frees_mb >= 0:
            text += f" (frees {row.frees_mb:.0f} MB)"
        elif row.frees_mb is not None:
            text += f" (needs {-row.frees_mb:.0f} MB more)"
    if row.oom_risk:
        text += f"  OOM risk: peak {mb_of_bytes(row.peak_used_bytes)} over {mb(row.booked_mb)} booked"
    return text


def figures(row: "ActorUsage | AppUsage") -> str:
    return (
        f"{booked(row)}  peak {mb_of_bytes(row.peak_used_bytes)}  p95 {mb_of_bytes(row.p95_used_bytes)}"
        f"  {row.samples} sample{'' if row.samples == 1 else 's'}"
    )


def header(doc: UsageDocument) -> str:
    since = datetime.datetime.fromtimestamp(doc.known_since, datetime.timezone.utc)
    text = f"Usage over the last {span(doc.window_s)}, headroom {doc.headroom_pct:g}%"
    if doc.covered_s + doc.slot_s < doc.window_s:
        text += f" (the head knows {span(doc.covered_s)} of it, since {since:%Y-%m-%d %H:%M:%S} UTC)"
    if doc.restored_from:
        text += f"; history restored from {doc.restored_from}"
    return printable(text) + ":"


def usage_lines(doc: UsageDocument) -> list[str]:
    """Per app (replicas, booking, peak and p95 per replica, suggestion), its replicas under
    it, then what re-booking frees cluster-wide."""
    lines = [header(doc), ""]
    if not doc.actors_read:
        return [*lines, "The head has not read the actor table yet: no GPU memory is attributed."]
    if not doc.actors:
        return [*lines, "No actor was measured on a GPU in the window."]
    by_app: dict[str, list[ActorUsage]] = {}
    for actor in doc.actors:
        by_app.setdefault(actor.app, []).append(actor)
    for app in doc.apps:
        differ = "  bookings differ" if app.bookings_differ else ""
        replicas = f"{app.replicas} replica{'' if app.replicas == 1 else 's'}"
        lines.append(printable(f"{app.app}  {replicas}  {figures(app)}  {verdict(app)}{differ}"))
        for actor in by_app.get(app.app, []):
            gone = "" if actor.alive else "  gone"
            label = f"{actor.name}#{actor.actor_id[:4]}"
            pid = f" pid {actor.pid}" if actor.pid else ""
            lines.append(printable(f"  {label}{pid}  {figures(actor)}  {verdict(actor)}{gone}"))
    if doc.actors_refused:
        lines.append(f"{doc.actors_refused} actor(s) not recorded: the head holds the most it keeps.")
    lines += ["", f"Re-booking at the suggestions frees {doc.frees_mb:.0f} MB cluster-wide."]
    return lines


_APP_METRICS: tuple[tuple[str, str, Callable[[AppUsage], Optional[float]]], ...] = (
    (
        "rayscope_app_gpu_memory_peak_bytes",
        "Most GPU memory one replica of the app held over the head's usage window (NVML, per process).",
        lambda a: a.peak_used_bytes,
    ),
    (
        "rayscope_app_gpu_memory_p95_bytes",
        "95th percentile of the per-slot maxima of the app's replicas over the usage window.",
        lambda a: a.p95_used_bytes,
    ),
    (
        "rayscope_app_booked_bytes",
        "GPU memory one replica of the app books (VRAM_MB, or its GPU fraction of the device), in bytes.",
        lambda a: None if a.booked_mb is None else a.booked_mb * MIB,
    ),
    (
        "rayscope_app_suggested_booking_bytes",
        "Peak plus the default headroom, rounded up to 256 MiB: the booking to ask for, in bytes.",
        lambda a: None if a.suggested_vram_mb is None else a.suggested_vram_mb * MIB,
    ),
    ("rayscope_app_replicas", "Replicas of the app alive in the actor table.", lambda a: a.replicas),
)


def usage_family_names() -> list[str]:
    return [name for name, _, _ in _APP_METRICS] + ["rayscope_usage_window_covered_seconds"]


def usage_metrics(doc: UsageDocument) -> str:
    """The per-app families, labelled by app (``app/deployment`` or class name), never by
    actor id, so labels stay as few as the apps; a value not known is absent."""
    lines: list[str] = []
    for name, help_text, value_of in _APP_METRICS:
        lines += family(name, help_text, ((f'app="{label_value(a.app)}"', value_of(a)) for a in doc.apps))
    lines += [
        "# HELP rayscope_usage_window_covered_seconds Seconds of the usage window the head has samples for.",
        "# TYPE rayscope_usage_window_covered_seconds gauge",
        f"rayscope_usage_window_covered_seconds {doc.covered_s:g}",
    ]
    return "\n".join(lines) + "\n"
