"""The head's page, one GPU: what its bar shows, then the bar as inline SVG.

Pure: a node of the status document in, a :class:`GpuBar` per GPU out (:func:`gpu_bars`),
then HTML (:func:`bar_html`). A bar has three lanes over the device's memory, never merged:

* **booked**: ``VRAM_MB`` booked on the device, one segment per actor (its name on hover);
  on a node without ``VRAM_MB`` the ``GPU`` fraction is the reservation, drawn as that share
  of the device's memory. Free space is the lane's empty rest.
* **handles**: Ray's ``GPU`` fraction booked on the device (0.04 on the seed's Europa).
* **measured**: NVML's used memory, where rayscope trusts it (hatched where NVML answered but
  is not trusted, e.g. on a vGPU guest; absent where unknown).

Every number shown is also text under the bar, so the page reads without hover or colour.
"""

import html
from collections.abc import Sequence
from typing import NamedTuple, Optional

from rayscope.core.gpu.precedence import figures_old
from rayscope.core.gpu.settled import settled_flags
from rayscope.core.gpu.trust import settled_used
from rayscope.labels import printable
from rayscope.render.fmt import gib
from rayscope.render.gpus import SOURCE_WORDS, fuller_devices, gpu_label, used_text
from rayscope.render.page.segments import Segment, actor_segments, gpu_users, placed_segments
from rayscope.schema.report import GpuDevice
from rayscope.schema.status import DeviceFree, NodeStatus
from rayscope.units import MIB


def esc(text: str) -> str:
    """Text for HTML, content or attribute: printable (SECURITY.md rule 4), then escaped."""
    return html.escape(printable(text), quote=True)


class Mark(NamedTuple):
    """A word on a bar that needs an operator: ``css`` is its class, ``why`` its hover."""

    css: str
    word: str
    why: str = ""


class GpuBar(NamedTuple):
    """One GPU as its bar shows it; ``None``: not known (drawn as nothing, written ``NA``)."""

    key: str
    """``NODE_ID:INDEX`` (``NODE_ID:rayN`` for a device only Ray's placement knows)."""
    label: str
    """``GPU0``, ``GPU0/MIG1``; a device only Ray's placement knows by Ray's id."""
    title: str
    capacity_mib: Optional[float]
    """The device's memory in MiB: NVML's total, else the node's ``VRAM_MB`` per GPU."""
    lane: Optional[float]
    """The booked lane's full width in its segments' unit: :attr:`capacity_mib`; on a node
    without ``VRAM_MB`` whose device's memory is unknown, 1 (segments are fractions)."""
    booked_mib: Optional[float]
    """``VRAM_MB`` booked here (on a node without it: the fraction times the capacity)."""
    booked_text: str
    """``20480/24576 MB`` or ``0.33 GPU`` (a node without ``VRAM_MB``) or ``NA``."""
    segments: list[Segment]
    handles: Optional[float]
    """Ray's ``GPU`` fraction booked on this device."""
    used_bytes: Optional[int]
    total_bytes: Optional[int]
    untrusted_bytes: Optional[int]
    """NVML's used figure where rayscope does not trust it (then ``used_bytes`` is ``None``)."""
    marks: list[Mark]
    vram_node: bool = True
    """The node books ``VRAM_MB`` (else the ``GPU`` fraction is the reservation)."""
    stale: bool = False
    """The measured figures are from a stale report (drawn grey)."""
    source: str = ""
    """Where the used figure comes from when not the agent's NVML: ``Ray dashboard, 3s old``
    (``CUDA, 3s old``); ``""`` otherwise."""


def _device_of(node: NodeStatus, index: int) -> Optional[DeviceFree]:
    devices = node.placement.devices if node.placement is not None else []
    return next((d for d in devices if d.nvml_index == index), None)


def _booked(node: NodeStatus, gpu: Optional[GpuDevice], device: Optional[DeviceFree]) -> Optional[float]:
    """``VRAM_MB`` booked on one device: the attribution's, Ray's placement's, or on a node
    with one GPU the node's own; ``None`` when no source says."""
    if gpu is not None and gpu.attribution is not None and gpu.attribution.booked_vram_mb is not None:
        return gpu.attribution.booked_vram_mb
    if device is not None:
        return device.booked_vram_mb
    return node.used_vram_mb if node.total_gpu <= 1 else None


def _handles(node: NodeStatus, gpu: Optional[GpuDevice], device: Optional[DeviceFree]) -> Optional[float]:
    if device is not None:
        return device.booked_gpu
    if gpu is not None and gpu.attribution is not None and gpu.attribution.booked_gpu is not None:
        return gpu.attribution.booked_gpu
    return node.used_gpu if node.total_gpu <= 1 and node.in_scheduler else None


def _marks(node: NodeStatus, gpu: Optional[GpuDevice], device: Optional[DeviceFree]) -> list[Mark]:
    marks = []
    if figures_old(node) and node.report_age_s is not None:
        marks.append(Mark("stale", f"stale {node.report_age_s:.0f}s", "NVML numbers from an old report"))
    if gpu is not None:
        flags = settled_flags(gpu)
        if flags:
            marks.append(Mark("unhealthy", "unhealthy", "; ".join(flags)))
        if "device" in gpu.errors or gpu.memory_used_bytes is None:
            why = "; ".join(f"{k}: {v}" for k, v in sorted(gpu.errors.items()))
            marks.append(Mark("unmeasured", "not measured", why))
        reason = settled_used(gpu).reason or _node_untrusted(node)
        if reason:
            marks.append(Mark("unreliable", "unreliable measurement", reason))
        att = gpu.attribution
        if att is not None and "full" in att.flags:
            marks.append(Mark("full", "full", "VRAM_MB booked here reaches the device's memory"))
        if any("over_booking" in u.flags for u in gpu_users(gpu)):
            marks.append(Mark("over", "over booking", "an actor here uses more than it booked"))
    if device is not None and device in fuller_devices(node):
        marks.append(Mark("fuller", "fuller than the node sum", "the node's sums hide how full this is"))
    return marks


def _node_untrusted(node: NodeStatus) -> str:
    """The node's reason its NVML used figure is not trusted although NVML answered and the
    report is fresh (a vGPU guest); ``""`` otherwise."""
    answered = node.nvml_memory_used_bytes is not None and not figures_old(node)
    return node.used_gpu_memory_reason if answered and node.used_gpu_memory_bytes is None else ""


def _capacity(node: NodeStatus, total_bytes: Optional[int]) -> Optional[float]:
    if total_bytes:
        return total_bytes / MIB
    if node.total_vram_mb > 0 and node.total_gpu > 0:
        return node.total_vram_mb / node.total_gpu
    return None


def _booked_text(
    node: NodeStatus,
    gpu: Optional[GpuDevice],
    device: Optional[DeviceFree],
    lane: tuple[Optional[float], Optional[float]],
) -> tuple[Optional[float], str]:
    """What the booked lane holds and its text: ``VRAM_MB`` booked here (``20480/24576 MB``);
    on a node without ``VRAM_MB`` the fraction (``0.33 GPU``) times the lane's scale.
    ``lane``: the device's capacity (MiB) and the lane's scale (see :attr:`GpuBar.lane`)."""
    capacity, scale = lane
    if node.total_vram_mb > 0:
        booked = _booked(node, gpu, device)
        cap = "NA" if capacity is None else f"{capacity:.0f}"
        return booked, "NA" if booked is None else f"{booked:.0f}/{cap} MB"
    handles = _handles(node, gpu, device)
    booked = None if handles is None or scale is None else handles * scale
    return booked, "NA" if handles is None else f"{handles:.2f} GPU"


def _unlisted(
    node: NodeStatus,
    device: Optional[DeviceFree],
    booked: Optional[float],
    segments: Sequence[Segment],
    lane: tuple[Optional[float], Optional[float]],
) -> list[Segment]:
    """A segment for what is booked here by work no actor listed on this GPU accounts for."""
    capacity, scale = lane
    vram_node = node.total_vram_mb > 0
    rest = 0.0 if booked is None else booked - sum(s.mib for s in segments)
    if rest > (0.5 if vram_node or capacity is not None else 0.005):  # in MiB, or a fraction
        actors = len(device.actors) if device is not None else 0
        who = (
            f"{actors} actor{'s' * (actors != 1)}"
            if actors and not segments
            else "tasks or actors not listed here"
        )
        amount = f"{rest:.0f} MB" if vram_node or not scale else f"GPU {rest / scale:.2f}"
        return [Segment(f"{who}: {amount}", rest)]
    return []


def _measured(
    node: NodeStatus, gpu: Optional[GpuDevice], device: Optional[DeviceFree]
) -> tuple[Optional[int], Optional[int]]:
    """(used bytes drawn as measured, NVML's used figure where rayscope does not trust it)."""
    if gpu is not None:
        used = settled_used(gpu).used_bytes
    else:
        used = device.memory_used_bytes if device is not None else None
    if _node_untrusted(node):
        used = None  # a stale report keeps its last trusted figure, drawn as old (the line's rule)
    untrusted = gpu.memory_used_bytes if gpu is not None and used is None and not figures_old(node) else None
    return used, untrusted


def _names(node: NodeStatus, gpu: Optional[GpuDevice], device: Optional[DeviceFree]) -> tuple[str, str, str]:
    """A bar's key, label and title."""
    if gpu is not None:
        label = gpu_label(gpu)
        return f"{node.node_id}:{gpu.index}", label, f"{label} {gpu.name or ''}".rstrip()
    assert device is not None
    title = f"Ray's GPU id {device.gpu_id} (no NVML report names the device)"
    return f"{node.node_id}:ray{device.gpu_id}", f"GPU{device.gpu_id}", title


def _bar(node: NodeStatus, gpu: Optional[GpuDevice], device: Optional[DeviceFree]) -> GpuBar:
    vram_node = node.total_vram_mb > 0
    total = gpu.memory_total_bytes if gpu is not None else (device.memory_total_bytes if device else None)
    capacity = _capacity(node, total)
    # The booked lane's scale: the device's MiB; without VRAM_MB and NVML, the fraction itself.
    lane = (capacity, capacity if capacity is not None or vram_node else 1.0)
    booked, booked_text = _booked_text(node, gpu, device, lane)
    segments = actor_segments(gpu_users(gpu), lane[1], vram_node) if gpu is not None else []
    if not segments and device is not None:
        segments = placed_segments(device, lane[1], vram_node)
    used, untrusted = _measured(node, gpu, device)
    key, label, title = _names(node, gpu, device)
    return GpuBar(
        key=key,
        label=label,
        title=title,
        capacity_mib=capacity,
        lane=lane[1],
        booked_mib=booked,
        booked_text=booked_text,
        segments=segments + _unlisted(node, device, booked, segments, lane),
        handles=_handles(node, gpu, device),
        used_bytes=used,
        total_bytes=total,
        untrusted_bytes=untrusted,
        marks=_marks(node, gpu, device),
        vram_node=vram_node,
        stale=figures_old(node),
        source=_source(gpu),
    )


def gpu_bars(node: NodeStatus) -> list[GpuBar]:
    """One bar per GPU NVML reported (MIG instances inside their GPU's); where no agent
    reports NVML, one per device of Ray's placement; else one per GPU Ray counts, booked as
    the node's sums allow (on one GPU they are the device's, on more ``NA``)."""
    if node.gpus:
        return [_bar(node, g, _device_of(node, g.index)) for g in node.gpus if g.parent_index is None]
    if node.placement is not None and node.placement.devices:
        return [_bar(node, None, d) for d in node.placement.devices]
    count = int(node.total_gpu) if node.total_gpu == int(node.total_gpu) else int(node.total_gpu) + 1
    placeholder = DeviceFree(gpu_id=0, visible_id="0", booked_gpu=node.used_gpu)
    if count == 1:
        return [_bar(node, None, placeholder)]
    return [
        _bar(node, None, DeviceFree(gpu_id=i, visible_id=str(i), booked_gpu=0.0))._replace(
            handles=None, booked_mib=None, booked_text="NA"
        )
        for i in range(count)
    ]


def percent(part: float, whole: float) -> str:
    """``part`` of ``whole`` as an SVG width (0 to 100)."""
    return f"{max(0.0, min(100.0, 100.0 * part / whole)):.2f}"


def _svg(bar: GpuBar) -> str:
    """The three lanes, 100 units wide (the SVG scales to its cell): booked by actor, handles,
    measured. Widths are attributes, not styles, so the page's CSP needs no inline style."""
    rects = ['<rect class="lane" x="0" y="0" width="100" height="8"/>']
    cap = bar.lane
    x = 0.0
    if cap:
        for i, seg in enumerate(bar.segments):
            width = float(percent(seg.mib, cap))
            width = min(width, 100.0 - x)
            shade = f"s{i % 4}" if bar.vram_node else f"f{i % 2}"  # a fraction: the handles' teal
            rects.append(
                f'<rect class="seg {shade}" x="{x:.2f}" y="0" width="{width:.2f}" height="8">'
                f"<title>{esc(seg.hover)}</title></rect>"
            )
            x += width
    rects.append('<rect class="lane" x="0" y="9.5" width="100" height="2.5"/>')
    if bar.handles is not None:
        rects.append(
            f'<rect class="handles" x="0" y="9.5" width="{percent(bar.handles, 1.0)}" height="2.5">'
            f"<title>GPU fraction booked: {bar.handles:.2f} of 1</title></rect>"
        )
    rects.append('<rect class="lane" x="0" y="13.5" width="100" height="4.5"/>')
    total = bar.total_bytes
    if total and bar.used_bytes is not None:
        rects.append(
            f'<rect class="{"old" if bar.stale else "used"}" x="0" y="13.5"'
            f' width="{percent(bar.used_bytes, total)}" height="4.5"><title>NVML: {gib(bar.used_bytes)}'
            f" of {gib(total)} GB in use{' (a stale report)' if bar.stale else ''}"
            f"{f' ({bar.source})' if bar.source else ''}</title></rect>"
        )
    elif total and bar.untrusted_bytes is not None:
        rects.append(
            f'<rect class="untrusted" x="0" y="13.5" width="{percent(bar.untrusted_bytes, total)}"'
            f' height="4.5"><title>NVML says {gib(bar.untrusted_bytes)} GB: not a measurement'
            "</title></rect>"
        )
    free = ", ".join(t for t in (_free_booking(bar), _free_measured(bar)) if t)
    label = f"{bar.title}: booked {bar.booked_text}, GPU {bar.handles}, measured {_measured_text(bar)}"
    label += f"; {free}" if free else ""
    return (
        f'<svg class="bar" viewBox="0 0 100 18" preserveAspectRatio="none" role="img"'
        f' aria-label="{esc(label)}">{"".join(rects)}</svg>'
    )


def _measured_text(bar: GpuBar) -> str:
    if bar.used_bytes is None and bar.untrusted_bytes is not None:
        return f"NA (NVML says {gib(bar.untrusted_bytes)})/{gib(bar.total_bytes)} GB"
    source = f" ({bar.source})" if bar.source and bar.used_bytes is not None else ""
    return f"{gib(bar.used_bytes)}/{gib(bar.total_bytes)} GB{source}"


def _source(gpu: Optional[GpuDevice]) -> str:
    """``Ray dashboard, 3s old`` (the GPU's line's words, render.gpus) or ``""``."""
    shown = gpu is not None and settled_used(gpu).source in SOURCE_WORDS
    return used_text(gpu)[1].strip(" ()") if gpu is not None and shown else ""


def _free_booking(bar: GpuBar) -> str:
    """``4096 MB free`` (``0.67 GPU free`` without ``VRAM_MB``); ``""`` when unknown."""
    if not bar.vram_node:
        return "" if bar.handles is None else f"{max(0.0, 1.0 - bar.handles):.2f} GPU free"
    if bar.capacity_mib is None or bar.booked_mib is None:
        return ""
    return f"{max(0.0, bar.capacity_mib - bar.booked_mib):.0f} MB free"


def _free_measured(bar: GpuBar) -> str:
    if bar.total_bytes is None or bar.used_bytes is None:
        return ""
    return f"{gib(max(0, bar.total_bytes - bar.used_bytes))} GB free"


def _free(text: str) -> str:
    return f' <span class="free">({esc(text)})</span>' if text else ""


def bar_html(bar: GpuBar) -> str:
    """One GPU's cell: its name and marks, the bar, then every number as text: what is
    booked (and free to book), the GPU fraction, what NVML measures (and leaves free)."""
    marks = "".join(
        f' <span class="mark {m.css}" title="{esc(m.why)}">{esc(m.word)}</span>' for m in bar.marks
    )
    handles = "NA" if bar.handles is None else f"{bar.handles:.2f}"
    css = "gpu" + (" marked" if bar.marks else "")
    return (
        f'<div class="{css}" data-gpu="{esc(bar.key)}">'
        f'<div class="t"><b title="{esc(bar.title)}">{esc(bar.label)}</b>{marks}</div>'
        f'{_svg(bar)}<div class="n">booked <span class="booked">{esc(bar.booked_text)}</span>'
        f"{_free(_free_booking(bar))}</div>"
        f'<div class="n">GPU <span class="fraction">{handles}</span>'
        f' · used <span class="measured">{esc(_measured_text(bar))}</span>{_free(_free_measured(bar))}</div>'
        f"{_actors_html(bar)}</div>"
    )


ACTORS_SHOWN = 4
"""Actors named under a bar; the rest are counted (every one stays on its segment's hover)."""


def _actors_html(bar: GpuBar) -> str:
    """The bar's actors in words, in the order of their segments: names on the page, not only
    on hover; ``""`` when nothing is booked here."""
    if not bar.segments:
        return ""
    named = [esc(seg.hover) for seg in bar.segments[:ACTORS_SHOWN]]
    more = len(bar.segments) - ACTORS_SHOWN
    named += [f"and {more} more (hover the bar)"] if more > 0 else []
    return f'<div class="n actors">{"; ".join(named)}</div>'
