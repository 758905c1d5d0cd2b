"""deploy/grafana/rayscope.json, read as Grafana imports it: template variables, panels,
queries. That every query returns data from a real Prometheus scraping a real head is
tests/test_live_prometheus.py; here, what can be told from the file alone.

Positive control: a panel query written ``node_id="$node"`` (an exact match, which breaks on
"All" and on several nodes chosen) fails
:func:`test_template_variables_are_matched_with_regex_only`.
"""

import json
import re
from typing import Any

from rayscope.render.metrics import family_names
from tests.support.deploy import DASHBOARD

VARIABLE_USE = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"\$\{?(\w+)\}?"')


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard()["templating"]["list"]}


def test_it_is_one_importable_dashboard() -> None:
    doc = dashboard()
    assert doc["id"] is None and doc["uid"] == "rayscope" and doc["title"]
    assert isinstance(doc["schemaVersion"], int) and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert all({"x", "y", "w", "h"} <= p["gridPos"].keys() for p in doc["panels"])
    assert "__inputs" not in doc  # nothing to answer on import: the data source is a variable


def test_the_datasource_is_a_variable_every_panel_uses() -> None:
    source = variables()["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    uses = [p["datasource"] for p in panels()] + [t["datasource"] for p in panels() for t in p["targets"]]
    assert uses and all(u == {"type": "prometheus", "uid": "${datasource}"} for u in uses)


def test_node_and_gpu_variables_are_label_values_queries() -> None:
    found = variables()
    for name, label in (("instance", "instance"), ("node", "node_id"), ("gpu", "uuid")):
        variable = found[name]
        assert variable["type"] == "query" and variable["includeAll"] and variable["multi"]
        assert variable["allValue"] == ".*"
        assert re.fullmatch(rf"label_values\(.+, {label}\)", variable["definition"]), variable["definition"]
        assert variable["query"]["query"] == variable["definition"]
        assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_template_variables_are_matched_with_regex_only() -> None:
    queries = exprs() + [v["definition"] for v in variables().values() if v["type"] == "query"]
    uses = [use for q in queries for use in VARIABLE_USE.findall(q)]
    assert uses and all(op == "=~" for _, op, _ in uses), [u for u in uses if u[1] != "=~"]
    assert {(label, name) for label, _, name in uses} == {
        ("instance", "instance"),
        ("node_id", "node"),
        ("uuid", "gpu"),
    }
    assert all("$" not in VARIABLE_USE.sub("", q) for q in queries)  # no other variable


def test_every_panel_has_queries_on_families_that_exist() -> None:
    known = set(family_names())
    for panel in panels():
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            named = set(re.findall(r"\brayscope_[a-z_]*[a-z]\b", target["expr"]))
            assert named and named <= known, (panel["title"], named - known)
            assert target["refId"]


def test_the_panels_cover_what_the_issue_asks() -> None:
    """Cluster booked vs total (VRAM_MB, GPU fraction, CPU), per GPU booked vs measured, stale
    agents, pending demands by reason, GPU health (XID, ECC, lost, remap)."""
    queried = " ".join(exprs())
    for family in (
        "rayscope_vram_booked_bytes",
        "rayscope_vram_capacity_bytes",
        "rayscope_gpus_booked",
        "rayscope_gpus_capacity",
        "rayscope_cpus_booked",
        "rayscope_cpus_capacity",
        "rayscope_device_vram_booked_bytes",
        "rayscope_device_memory_used_bytes",
        "rayscope_device_gpu_booked",
        "rayscope_report_stale",
        "rayscope_gpu_xid_errors_total",
        "rayscope_gpu_ecc_uncorrected_volatile_errors_total",
        "rayscope_gpu_lost",
        "rayscope_gpu_row_remap_pending",
        "rayscope_gpu_row_remap_failure",
    ):
        assert family in queried, family
    assert "sum by (reason) (rayscope_pending_demands" in queried
