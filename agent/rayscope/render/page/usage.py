"""The page's "Bookings beside use" section: per app, a bar of what one replica booked beside
the most it held over the head's usage window and the booking to ask for (``rayscope usage``'s
app line under it). Widths are SVG attributes, as in :mod:`rayscope.render.page.bars`, so the
page's CSP needs no inline style."""

from typing import Optional

from rayscope.render.page.bars import esc, percent
from rayscope.render.usage import figures, header, verdict
from rayscope.schema.usage import AppUsage, UsageDocument
from rayscope.units import MIB


def _app_svg(app: AppUsage) -> str:
    """Three lanes on one scale: booked per replica, the suggestion, the peak."""
    peak_mib = None if app.peak_used_bytes is None else app.peak_used_bytes / MIB
    figures_mib = [x for x in (app.booked_mb, app.suggested_vram_mb, peak_mib) if x]
    scale = max(figures_mib, default=0.0)
    rects = ['<rect class="lane" x="0" y="0" width="100" height="8"/>']
    lanes = (
        (app.booked_mb, "seg s0", 0.0, 8.0, "booked per replica"),
        (app.suggested_vram_mb, "suggest", 9.5, 2.5, "the booking to ask for"),
        (peak_mib, "used", 13.5, 4.5, "the most one replica held in the window"),
    )
    for value, css, y, height, what in lanes:
        if y:
            rects.append(f'<rect class="lane" x="0" y="{y}" width="100" height="{height}"/>')
        if value and scale:
            rects.append(
                f'<rect class="{css}" x="0" y="{y}" width="{percent(value, scale)}" height="{height}">'
                f"<title>{esc(f'{what}: {value:.0f} MB')}</title></rect>"
            )
    label = f"{app.app}: {figures(app)}, {verdict(app)}"
    return (
        f'<svg class="bar" viewBox="0 0 100 18" preserveAspectRatio="none" role="img"'
        f' aria-label="{esc(label)}">{"".join(rects)}</svg>'
    )


def apps_html(doc: Optional[UsageDocument]) -> str:
    """The section; ``""`` when the head keeps no usage history or no app was measured."""
    if doc is None or not doc.apps:
        return ""
    cells = []
    for app in doc.apps:
        replicas = f"{app.replicas} replica{'' if app.replicas == 1 else 's'}"
        cells.append(
            f'<div class="gpu" data-app="{esc(app.app)}">'
            f'<div class="t"><b>{esc(app.app)}</b> {replicas}</div>'
            f'{_app_svg(app)}<div class="n">{esc(figures(app))}</div>'
            f'<div class="n suggestion">{esc(verdict(app))}</div></div>'
        )
    return (
        f'<h2>Bookings beside use</h2><p class="note">{esc(header(doc))} booked per replica (top),'
        f" the booking to ask for (middle), the most one replica held (bottom)</p>"
        '<div class="legend"><span><i class="key kb"></i>booked per replica</span>'
        '<span><i class="key ks"></i>the booking to ask for</span>'
        '<span><i class="key ku"></i>the most one replica held</span></div>'
        f'<div class="gpus apps">{"".join(cells)}</div>'
    )
