"""``GET /`` on the head: the cluster as one self-contained HTML page.

Pure: the status document the head serves on ``/v1/status?gpus=1`` in, HTML out. The server
renders the whole page (it reads without JavaScript; the golden is this output); a little
inline script then refetches the same view every interval (``?fragment=1``: only the
``<main>`` element) so there is one renderer, not a second one in JavaScript. Nothing is
loaded from anywhere but the head (:mod:`rayscope.render.page.assets` holds the CSS, the script
and the policy that allows only them).

At the top the cluster totals and what waits; then per node its status line (the same text
``rayscope status`` prints) and a bar per GPU (:mod:`rayscope.render.page.bars`). Nodes come
:data:`PAGE_NODES` to a page, GPU nodes first; ``?marked=1`` shows only nodes with something
to look at (stale, no agent, unhealthy, unreliable, fuller than the node sum, ...).
"""

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import NamedTuple, Optional

from rayscope.core.rollup import SchedulerView, scheduler_failure, scheduler_view
from rayscope.render.fmt import cpus, gib, has_gpus, labels_text, source_notes, visible_nodes
from rayscope.render.page.assets import CSS, HATCH, JS
from rayscope.render.page.bars import GpuBar, bar_html, esc, gpu_bars
from rayscope.render.page.usage import apps_html
from rayscope.render.status import cluster_line, demand_line, node_line, node_markers
from rayscope.schema.status import ClusterStatus, NodeStatus
from rayscope.schema.usage import UsageDocument
from rayscope.units import parse_count

PAGE_NODES = 100
"""Nodes on one page: 100 nodes of 8 GPUs stay one page; 1,000 are ten."""


class PageQuery(NamedTuple):
    """What the page's URL asks for: ``?page=N&marked=1&fragment=1``."""

    page: int = 1
    marked: bool = False
    fragment: bool = False


def page_query(query: Mapping[str, Sequence[str]]) -> PageQuery:
    """The page's query string (parsed); anything unreadable is the default, never an error."""
    try:
        page = parse_count((query.get("page") or ["1"])[0], "page", maximum=999_999)
    except ValueError:
        page = 1
    yes = ("1", "true", "yes")
    marked = (query.get("marked") or ["0"])[0] in yes
    return PageQuery(max(1, page), marked, (query.get("fragment") or ["0"])[0] in yes)


FEW_GPUS = 2
"""Nodes with at most this many GPUs get wider bars."""


class _Node(NamedTuple):
    node: NodeStatus
    line: str
    """The node's ``status`` line without the markers that mark it (those are :attr:`badges`)."""
    bars: list[GpuBar]
    marked: bool
    badges: list[str]
    """The markers of its ``status`` line that mark the node (``no agent``, ``stale 42s``, ...)."""


BADGE_WHY = {
    "no agent": "no rayscope agent reports this node: its GPU memory is not measured"
    " (run rayscope push on it, or rayscope head --agents ray)",
    "stale": "its agent's last report is this old: the measured figures are from then",
    "no raylet": "an agent reports this node, but the scheduler does not know it",
    "not in scheduler view": "an agent reports this node; the head has no scheduler view to check it against",
    "scheduler view": "the GCS stopped answering: the node's bookings are as of then",
    "dead": "the scheduler says this node is dead",
}
"""A node badge's hover, by the marker's first words (the ``status`` line's own words)."""


def _badge_why(marker: str) -> str:
    if marker.endswith("GPU(s) not measured"):
        return "NVML did not give these GPUs' memory (a lost GPU): the node's sums are NA"
    return next((why for start, why in BADGE_WHY.items() if marker.startswith(start)), "")


def _nodes(status: ClusterStatus) -> list[_Node]:
    """Every visible node with its line and bars, GPU nodes first (each group in the rollup's
    order: head, then by IP)."""
    state = scheduler_view(status)
    old_age = status.scheduler_age_s if state is SchedulerView.OLD else None
    nodes = visible_nodes(status, include_dead=False)
    ordered = [n for n in nodes if has_gpus(n)] + [n for n in nodes if not has_gpus(n)]
    out = []
    for node in ordered:
        markers = node_markers(node, status.view, state is not SchedulerView.NONE, old_age)
        covered = [m for m in markers if m.startswith("agent:")]
        badges = [m for m in markers if not m.startswith("agent:")]
        line = node_line(node, status.view, state is not SchedulerView.NONE, old_age, markers=covered)
        bars = gpu_bars(node) if has_gpus(node) else []
        marked = bool(bars and any(b.marks for b in bars)) or bool(badges)
        out.append(_Node(node, line, bars, marked, badges))
    return out


def _line_html(n: _Node) -> str:
    """The node's line, then a badge per marker that marks it, its reason on hover."""
    badges = "".join(
        f' <span class="mark node" title="{esc(_badge_why(m))}">{esc(m)}</span>' for m in n.badges
    )
    labels = labels_text(n.node)
    shown = f' <span class="labels" title="Ray labels">{esc(labels)}</span>' if labels else ""
    return f"{esc(n.line)}{_identity_html(n.node)}{shown}{badges}"


def _identity_html(node: NodeStatus) -> str:
    """Who the node is beside its IP (two nodes can share one): its host name where an agent
    or Ray said it, and the start of its node id (the whole id on hover)."""
    who = " · ".join(filter(None, (node.hostname or "", f"node {node.node_id[:8]}")))
    return f' <span class="who" title="node id {esc(node.node_id)}">{esc(who)}</span>'


def _tile(title: str, value: str, detail: str = "") -> str:
    return f'<div class="tile">{esc(title)}<b>{esc(value)}</b><span>{esc(detail)}</span></div>'


def _totals(status: ClusterStatus) -> str:
    c = status.cluster
    measured = f"{gib(c.used_gpu_memory_bytes)}/{gib(c.total_gpu_memory_bytes)} GB"
    pending = "not read" if c.pending is None else str(sum(d.count for d in c.pending))
    tiles = [
        _tile("nodes", f"{c.nodes_alive} alive", f"{c.gpu_nodes} with GPUs, {c.nodes_dead} dead"),
        _tile("CPUs booked", f"{cpus(c.used_cpu)}/{cpus(c.total_cpu)}"),
        _tile("GPU handles booked", f"{c.used_gpu:.2f}/{c.total_gpu:.0f}", "Ray's GPU resource"),
        _tile(
            "VRAM_MB booked",
            f"{c.used_vram_mb:.0f}/{c.total_vram_mb:.0f} MB" if c.total_vram_mb > 0 else "none",
            "MiB, as Ray counts it" if c.total_vram_mb > 0 else "no node advertises VRAM_MB",
        ),
        _tile("GPU memory measured", measured, f"NVML, {c.gpu_nodes_measured} of {c.gpu_nodes} GPU nodes"),
        _tile("pending", pending, "demands waiting"),
    ]
    return f'<div class="totals">{"".join(tiles)}</div><p class="line">{esc(cluster_line(status))}</p>'


def _banners(status: ClusterStatus) -> str:
    state = scheduler_view(status)
    out = []
    if state is SchedulerView.NONE:
        out.append(
            "No scheduler view: the head has not read the GCS"
            f"{scheduler_failure(status)}. Nodes below are only what agents report; bookings,"
            " liveness and what waits are not known."
        )
    elif state is SchedulerView.OLD and status.scheduler_age_s is not None:
        out.append(
            f"Scheduler view {status.scheduler_age_s:.0f}s old (the GCS stopped answering):"
            " nodes, liveness and bookings are as of then."
        )
    banners = "".join(f'<p class="banner">{esc(text)}</p>' for text in out)
    notes = "".join(f'<p class="note">{esc(text)}</p>' for text in source_notes(status.sources))
    return banners + notes


def _as_of(status: ClusterStatus, shown: int, total: int) -> str:
    stamp = datetime.fromtimestamp(status.generated_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    age = status.scheduler_age_s
    words = [f"as of {stamp}"]
    if scheduler_view(status) is SchedulerView.NONE:
        words.append("no scheduler view")
    elif age is not None:
        words.append(f"scheduler view {age:.0f}s old")
    words.append(f"{shown} of {total} nodes shown")
    return f'<p class="note">{esc(" · ".join(words))}</p>'


def _pending(status: ClusterStatus) -> str:
    demands = status.cluster.pending
    if demands is None:
        return '<h2>Pending</h2><p class="note">not read (the head reads it with the scheduler view)</p>'
    if not demands:
        return '<h2>Pending</h2><p class="note">nothing waits</p>'
    items = "".join(
        f'<li>{esc(demand_line(d))}<br><span class="why">{esc(d.reason_text)}</span></li>' for d in demands
    )
    return f'<h2>Pending</h2><ul class="pending">{items}</ul>'


def _nav(query: PageQuery, pages: list[list[_Node]], marked_total: int) -> str:
    links = []
    if len(pages) > 1:
        for i, group in enumerate(pages, start=1):
            flagged = sum(n.marked for n in group)
            here = ' class="here"' if i == query.page else ""
            label = f"{i}" + (f" ({flagged} marked)" if flagged else "")
            links.append(f'<a{here} href="?page={i}{"&amp;marked=1" if query.marked else ""}">{label}</a>')
    if query.marked:
        toggle = '<a href="?page=1">all nodes</a>'
    elif marked_total:
        nodes = "the marked node" if marked_total == 1 else f"the {marked_total} marked nodes"
        toggle = f'<a href="?marked=1">only {nodes}</a>'
    else:
        toggle = '<span class="note">no node is marked</span>'
    return f'<nav class="pages">{"pages: " + "".join(links) if links else ""} {toggle}</nav>'


LEGEND = (
    '<div class="legend"><span><i class="key kb"></i>VRAM_MB booked: a segment per actor'
    ' (named under the bar)</span><span><i class="key kh"></i>GPU fraction booked (handles;'
    " on a node without VRAM_MB, also the booked lane)</span>"
    '<span><i class="key ku"></i>NVML measured</span><span><i class="key kf"></i>free</span></div>'
)


def view_html(status: ClusterStatus, query: PageQuery, usage: Optional[UsageDocument] = None) -> str:
    """The ``<main>`` element's content: what the refresh replaces. ``usage``: the head's
    usage history, for the apps' bookings beside their use (``rayscope usage``)."""
    everyone = _nodes(status)
    marked_total = sum(n.marked for n in everyone)
    chosen = [n for n in everyone if n.marked] if query.marked else everyone
    pages = [chosen[i : i + PAGE_NODES] for i in range(0, len(chosen), PAGE_NODES)] or [[]]
    query = query._replace(page=min(query.page, len(pages)))
    shown = pages[query.page - 1]
    parts = [_banners(status), _totals(status), _as_of(status, len(shown), len(everyone)), _pending(status)]
    parts += [apps_html(usage)] if usage is not None and usage.apps else []
    parts += [_nav(query, pages, marked_total), LEGEND]
    gpu_nodes = [n for n in shown if has_gpus(n.node)]
    cpu_nodes = [n for n in shown if not has_gpus(n.node)]
    if gpu_nodes:
        parts.append("<h2>GPU nodes</h2>")
        for n in gpu_nodes:
            css = "node marked" if n.marked else "node"
            few = " few" if len(n.bars) <= FEW_GPUS else ""
            parts.append(
                f'<details class="{css}" id="n-{esc(n.node.node_id)}" open><summary>{_line_html(n)}</summary>'
                f'<div class="gpus{few}">{"".join(bar_html(b) for b in n.bars)}</div></details>'
            )
    if cpu_nodes:
        items = "".join(f'<li id="n-{esc(n.node.node_id)}">{_line_html(n)}</li>' for n in cpu_nodes)
        parts.append(f'<h2>CPU-only nodes</h2><ul class="cpu">{items}</ul>')
    if not everyone:
        parts.append('<p class="note">no nodes: the scheduler view and the agents name none</p>')
    return "\n".join(parts)


def page_html(
    status: ClusterStatus, query: PageQuery, refresh_s: float, usage: Optional[UsageDocument] = None
) -> str:
    """The whole page, or with ``query.fragment`` only what :func:`view_html` gives."""
    if query.fragment:
        return view_html(status, query, usage)
    where = f"head view of GCS {status.gcs_address}" if status.gcs_address else "head view, no GCS address"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>rayscope · {esc(status.gcs_address or 'head')}</title>"
        f'<noscript><meta http-equiv="refresh" content="{refresh_s:.0f}"></noscript>'
        f"<style>{CSS}</style></head>\n<body><header><h1>rayscope</h1>"
        f'<span class="where">{esc(where)}</span><span id="age">refreshes every {refresh_s:.0f} s</span>'
        f'</header>\n<main id="view" data-refresh="{refresh_s:.0f}">\n'
        f"{view_html(status, query, usage)}\n</main>\n"
        f"{HATCH}<script>{JS}</script></body></html>\n"
    )


def login_html(message: str = "", refresh_s: float = 5.0) -> str:
    """The form ``GET /`` answers (401) when the head has a token and the request none: the
    page's frame with the form in its ``<main>``. Where this tab holds a session (a login
    kept it, :func:`session_html`), the page's script hides the form and reads the page
    with it (agent/rayscope/head/access/session.py)."""
    note = f'<p class="banner">{esc(message)}</p>' if message else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1"><title>rayscope · log in</title>'
        f'<style>{CSS}</style></head>\n<body><header><h1>rayscope</h1><span class="where"></span>'
        f'<span id="age"></span></header>\n<main id="view" data-refresh="{refresh_s:.0f}">'
        '<form class="login" method="post" action="/login"><h1>rayscope</h1>'
        f"{note}<label>The head's read token (or its agents' token)"
        '<input type="password" name="token" autocomplete="current-password" autofocus required>'
        '</label><button type="submit">Log in</button>'
        '<p class="note">Keeps a session in this tab only, for 12 h: no cookie.</p>'
        "<noscript><p>The login needs JavaScript; without it, send"
        " <code>Authorization: Bearer TOKEN</code>.</p></noscript>"
        f"</form></main>\n{HATCH}<script>{JS}</script></body></html>\n"
    )


def session_html(value: str) -> str:
    """A login's answer: the session ``value`` (agent/rayscope/head/access/session.py) for the page's script
    to keep in this tab's ``sessionStorage``, before it opens ``/`` with it."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>rayscope · logged in</title>'
        f'<style>{CSS}</style></head>\n<body><p class="note" id="session" data-value="{esc(value)}">'
        'logged in: <a href="/">the page</a></p>'
        "<noscript><p>The login needs JavaScript; without it, send"
        " <code>Authorization: Bearer TOKEN</code>.</p></noscript>"
        f"<script>{JS}</script></body></html>\n"
    )
