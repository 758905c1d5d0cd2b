"""``fit --label-selector``: only the nodes a selector admits are candidates, from a recorded
Ray 2.60 read (tests/data/gcs_labels_read.json: head ``zone=a`` 24576 MB of ``VRAM_MB``, a node
``zone=b`` 16384 MB). The live half is tests/test_live_labels.py.

Positive control: returning every node from ``fit_labels.admitted`` fits 20000 MB on the
head for ``zone=b`` and fails the first test.
"""

from typing import Any

import msgspec
import pytest

from rayscope.core.capacity import fit
from rayscope.core.capacity.fit_labels import label_options, with_label_selector
from rayscope.errors import AgentError
from rayscope.render.fit import fit_json, fit_lines
from rayscope.render.status import status_json
from rayscope.schema.fit import FitRequest, FitResult
from rayscope.schema.report import SourceStatus
from tests.golden import check_golden
from tests.scenarios import labels_pending_status, seed_status
from tests.schemas import parsed


def answer(status: Any, selector: dict[str, str], **request: Any) -> FitResult:
    return fit.fit(status, with_label_selector(FitRequest(**request), selector))


def test_only_admitted_nodes_are_candidates() -> None:
    status = labels_pending_status()
    on_b = answer(status, {"zone": "b"}, gpu_memory_mb=20000)
    assert (on_b.fits, on_b.admitted_nodes, on_b.alive_nodes, len(on_b.nodes)) == (False, 1, 2, 1)
    assert fit.exit_code(on_b) == 1
    on_a = answer(status, {"zone": "a"}, gpu_memory_mb=20000)
    assert (on_a.fits, on_a.admitted_nodes, on_a.placed) == (True, 1, 1)
    anywhere = fit.fit(status, FitRequest(gpu_memory_mb=20000))
    assert anywhere.fits and isinstance(anywhere.admitted_nodes, msgspec.UnsetType)


@pytest.mark.parametrize(
    ("value", "admitted"),
    [("in(a,b)", 2), ("!a", 1), ("!in(a,b)", 0), ("in(a, b)", 1), ("!c", 2)],
)
def test_operators(value: str, admitted: int) -> None:
    """``in(a, b)``: Ray keeps the space, so `` b`` matches no node (measured, selectors.py)."""
    result = answer(labels_pending_status(), {"zone": value}, gpu_memory_mb=1024)
    assert result.admitted_nodes == admitted


def test_a_selector_that_admits_none_does_not_fit_and_names_it() -> None:
    result = answer(labels_pending_status(), {"zone": "c"}, gpu_memory_mb=1024)
    assert (result.fits, fit.exit_code(result), result.nodes) == (False, 1, [])
    assert result.label_miss == "no alive node has zone=c (zone: a on 1 node, b on 1)"
    assert "Fits: no, no alive node has zone=c (zone: a on 1 node, b on 1)" in fit_lines(result)


def test_an_unknown_operator_is_not_judged() -> None:
    with pytest.raises(AgentError) as err:
        answer(labels_pending_status(), {"zone": "exists()"}, gpu_memory_mb=1024)
    assert err.value.exit_code == 2
    assert str(err.value).startswith("could not tell: --label-selector zone=exists(): an operator")


@pytest.mark.parametrize(
    ("ray", "line"),
    [
        (
            "cluster Ray 2.40.0, reader Ray 2.60.0",
            "--label-selector: Ray 2.40.0 gives its nodes no labels (labels and label selectors came"
            " in Ray 2.49)",
        ),
        (
            "cluster Ray unknown, reader Ray 2.60.0",
            "--label-selector: this cluster's Ray gives its nodes no labels (labels and label selectors came"
            " in Ray 2.49)",
        ),
    ],
)
def test_a_ray_without_labels_says_so_exit_2(ray: str, line: str) -> None:
    """The seed's nodes carry no labels of Ray's own (as a Ray before 2.49 reads)."""
    status = msgspec.structs.replace(
        seed_status(), sources=[*seed_status().sources, SourceStatus(name="ray", ok=True, detail=ray)]
    )
    with pytest.raises(AgentError) as err:
        answer(status, {"zone": "a"}, gpu_memory_mb=1024)
    assert (err.value.exit_code, str(err.value)) == (2, line)
    assert fit.fit(status, FitRequest(gpu_memory_mb=1024)).fits  # without a selector: as ever


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["zone"], "--label-selector zone: give KEY=VALUE (e.g. zone=b, zone=!in(a,b))"),
        (["zone=a", "zone=b"], "--label-selector: zone given twice (one value per key, as in Ray)"),
    ],
)
def test_option_values_that_are_not_a_selector(values: list[str], message: str) -> None:
    with pytest.raises(AgentError) as err:
        label_options(values)
    assert (err.value.exit_code, str(err.value)) == (2, message)


def test_a_value_ray_refuses_is_a_usage_error() -> None:
    with pytest.raises(AgentError) as err:
        with_label_selector(FitRequest(gpu_memory_mb=1), label_options(["zone=in(a b)"]))
    assert err.value.exit_code == 2 and "not a selector value Ray accepts" in str(err.value)


def test_golden_fit_with_a_selector() -> None:
    result = answer(labels_pending_status(), {"zone": "b"}, gpu_memory_mb=20000)
    assert fit_lines(result)[1] == "Label selector: zone=b admits 1 of 2 alive node(s)"
    check_golden("fit_labels_zone_b.txt", "\n".join(fit_lines(result)) + "\n")
    check_golden("fit_labels_zone_b.json", fit_json(result) + "\n")
    assert parsed(fit_json(result), "fit")["admitted_nodes"] == 1


def test_node_labels_in_the_status_document_are_bounded_and_escaped() -> None:
    """A node's labels are a peer's strings (any raylet's ``--labels``): escaped, cut, counted."""
    from rayscope.core.capacity.selectors import MAX_NODE_LABELS, shown_labels

    node_id = "ab" * 28
    planted = {
        "ray.io/node-id": node_id,
        "zone": "a\x1b[2Jb",
        "a-long": "v" * 500,
        **{f"k{i:03}": "x" for i in range(99)},
    }
    shown = shown_labels(planted)
    assert shown is not None and len(shown) == MAX_NODE_LABELS
    assert "ray.io/node-id" not in shown and node_id not in shown.values()
    assert shown["a-long"] == "v" * 63
    every = shown_labels({"ray.io/node-id": node_id, "zone": "a\x1b[2Jb"})
    assert every is not None and "\x1b" not in every["zone"] and every["zone"].startswith("a")
    assert shown_labels({"zone": "a"}) is None  # no ray.io/node-id: a Ray before 2.49


def test_status_json_carries_labels_without_the_node_id() -> None:
    doc = parsed(status_json(labels_pending_status()), "status")
    assert sorted(n["labels"]["zone"] for n in doc["nodes"].values()) == ["a", "b"]
    assert all("ray.io/node-id" not in n["labels"] for n in doc["nodes"].values())
    seed = parsed(status_json(seed_status()), "status")
    assert all("labels" not in n for n in seed["nodes"].values())
