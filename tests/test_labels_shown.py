"""A node's Ray labels where its identity is shown: ``node``'s raylet block and the head's
page, from the recorded labelled cluster (tests/data/gcs_labels_read.json: ``zone=a`` head,
``zone=b`` node). The live half is tests/test_live_labels.py.

Positive control: dropping the page's ``esc`` on the labels lets the planted ``<b>`` through
and fails :func:`test_the_page_escapes_a_planted_label`.
"""

import msgspec

from rayscope.render.node import raylet_lines
from rayscope.render.page.document import PageQuery, page_html
from rayscope.schema.report import RayletInfo
from rayscope.schema.status import ClusterStatus, NodeStatus
from tests.scenarios import labels_pending_status, seed_status


def by_zone(status: ClusterStatus) -> dict[str, NodeStatus]:
    return {n.labels["zone"]: n for n in status.nodes.values() if isinstance(n.labels, dict)}


def test_node_shows_its_labels_under_the_scheduler_line() -> None:
    head = by_zone(labels_pending_status())["a"]
    raylet = RayletInfo(pid=1, node_id=head.node_id, node_ip="127.0.0.1", is_head=True)
    lines = raylet_lines(raylet, head)
    assert lines[1].startswith("  scheduler: ") and lines[2] == "  labels: zone=a"
    assert head.node_id not in lines[2]  # ray.io/node-id: the first line names the node already


def test_a_node_without_labels_gets_no_line() -> None:
    seed = next(iter(seed_status().nodes.values()))
    raylet = RayletInfo(pid=1, node_id=seed.node_id, node_ip="127.0.0.1")
    assert not any(line.startswith("  labels:") for line in raylet_lines(raylet, seed))


def test_the_page_shows_each_nodes_labels_on_its_line() -> None:
    html = page_html(labels_pending_status(), PageQuery(), 5.0)
    for zone in ("a", "b"):
        assert f'<span class="labels" title="Ray labels">zone={zone}</span>' in html


def test_the_page_escapes_a_planted_label() -> None:
    status = labels_pending_status()
    head = by_zone(status)["a"]
    planted = msgspec.structs.replace(head, labels={"zone": "<b>x</b>"})
    status.nodes[head.node_id] = planted
    html = page_html(status, PageQuery(), 5.0)
    assert "zone=&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
