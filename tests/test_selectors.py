"""Ray's label selector syntax and matching, pure, from tables: what Ray's own check accepts
and refuses, how its scheduler decides each operator (``!v`` admits a node without the
label; ``in(a, b)`` keeps the space, as Ray 2.49-2.60 do, measured live in
tests/test_live_labels.py), and an operator rayscope does not know: kept verbatim, never
matching."""

import importlib
from typing import Any

import pytest

from rayscope.core.capacity import selectors as sel
from rayscope.schema.pending import LabelConstraint

A100 = {"ray.io/accelerator-type": "A100", "zone": "a"}
T4 = {"ray.io/accelerator-type": "T4", "zone": "b"}
BARE: dict[str, str] = {}

# (value in Ray's syntax, operator, values, admits A100, admits T4, admits a node without labels)
TABLE = [
    ("A100", "in", ["A100"], True, False, False),
    ("!A100", "!in", ["A100"], False, True, True),
    ("in(A100,T4)", "in", ["A100", "T4"], True, True, False),
    ("!in(A100,T4)", "!in", ["A100", "T4"], False, False, True),
    ("in(A100, T4)", "in", ["A100", " T4"], True, False, False),  # Ray keeps " T4"
    ("in(H100)", "in", ["H100"], False, False, False),
    ("(A100,T4)", "in", ["(A100,T4)"], False, False, False),  # Ray's check takes it; its parser a literal
    ("exists()", "exists", [""], False, False, False),  # unknown: never matching
    ("!exists(x)", "!exists", ["x"], False, False, False),
]


@pytest.mark.parametrize(("text", "operator", "values", "a100", "t4", "bare"), TABLE)
def test_each_value_is_parsed_and_judged_as_ray_does(
    text: str, operator: str, values: list[str], a100: bool, t4: bool, bare: bool
) -> None:
    constraint = sel.parse_value("ray.io/accelerator-type", text)
    assert (constraint.operator, constraint.values) == (operator, values)
    assert [sel.admits([constraint], labels) for labels in (A100, T4, BARE)] == [a100, t4, bare]
    assert bool(sel.unknown([constraint])) is (operator not in ("in", "!in"))


@pytest.mark.parametrize(
    "text", ["!", "in()", "in(a,", "-spot", "spot_", "!!a", "in(H100, TPU!GPU)", "a b", "x" * 64]
)
def test_values_rays_check_refuses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a selector value Ray accepts"):
        sel.parse_value("zone", text)


@pytest.mark.parametrize("key", ["", "-zone", "zone_", "a/b/", "b@d/zone", "x" * 64, "p" * 254 + "/k"])
def test_keys_rays_check_refuses_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="label key"):
        sel.parse_value(key, "a")


def test_every_constraint_must_hold() -> None:
    selector = sel.parse({"ray.io/accelerator-type": "!T4", "zone": "in(a,c)"})
    assert sel.admits(selector, A100) and not sel.admits(selector, T4)
    assert sel.admits([], BARE)  # no selector: any node


def test_the_text_is_rays_syntax_again() -> None:
    for text in ("A100", "!A100", "in(A100,T4)", "!in(A100,T4)", "in(A100, T4)", "exists()"):
        constraint = sel.parse_value("k", text)
        assert sel.value_text(constraint) == text
    # Ray keeps in(...)'s values unordered: the text sorts them, a space aside.
    read = LabelConstraint(key="zone", operator="in", values=[" d", "c"])
    assert sel.value_text(read) == "in(c, d)"
    assert sel.same([read], sel.parse({"zone": "in(c, d)"}))
    assert not sel.same([read], sel.parse({"zone": "in(c,d)"}))


def test_a_value_read_from_the_gcs_that_is_not_rays_syntax_is_unknown_not_an_error() -> None:
    read = sel.parse_read({"zone": "~weird"})
    assert sel.unknown(read) and not sel.admits(read, {"zone": "~weird"})
    assert sel.selector_text(read) == "zone=~weird"


def test_why_none_names_the_selector_and_what_the_cluster_has() -> None:
    nodes = [T4, T4, {"ray.io/accelerator-type": "G"}]
    text = sel.why_none(sel.parse({"ray.io/accelerator-type": "A100"}), nodes)
    assert text == (
        "no alive node has ray.io/accelerator-type=A100 (ray.io/accelerator-type: T4 on 2 nodes, G on 1)"
    )
    # Only the keys no node meets alone are named; a key nobody has says so.
    text = sel.why_none(sel.parse({"zone": "b", "rack": "r1"}), nodes)
    assert text == "no alive node has zone=b rack=r1 (no node has rack)"
    # Each constraint alone is met, both together by none: both keys named.
    text = sel.why_none(sel.parse({"zone": "b", "ray.io/accelerator-type": "G"}), nodes)
    assert text.endswith("(zone: b on 2 nodes, none on 1; ray.io/accelerator-type: T4 on 2 nodes, G on 1)")


def test_why_none_is_bounded_and_printable() -> None:
    many = [{"zone": f"z{i:03d}"} for i in range(500)] + [{"zone": "evil\x1b[2J"}]
    text = sel.why_none(sel.parse({"zone": "nowhere"}), many)
    assert "\x1b" not in text and len(text) < 300
    assert text.endswith(", 497 more value(s))")


def test_why_none_points_at_a_space_ray_keeps() -> None:
    text = sel.why_none(sel.parse({"zone": "in(c, d)"}), [{"zone": "d"}])
    assert text == (
        "no alive node has zone=in(c, d) (zone: d on 1 node); Ray keeps the space in ' d':"
        " write in(...) without spaces"
    )


CHECKED = [
    *(row[0] for row in TABLE if not row[0].startswith(("exists", "!exists"))),
    "!", "in()", "in(a,", "-spot", "spot_", "!!a", "in(H100, TPU!GPU)", "a b", "x" * 63, "x" * 64, "",
    "in(a,  b)", "!in( a)",
]  # fmt: skip
KEYS = [
    "zone",
    "ray.io/accelerator-type",
    "",
    "-zone",
    "zone_",
    "a/b/",
    "bad..prefix/zone",
    "b@d/z",
    "x" * 64,
]


def test_the_same_values_and_keys_as_rays_own_check() -> None:
    """Ray's own validation (the Ray of this venv) is the oracle: what it accepts parses,
    what it refuses is refused (an unknown operator aside, which Ray refuses today)."""
    label_utils: Any = importlib.import_module("ray._private.label_utils")
    for text in CHECKED:
        ray_ok = label_utils.validate_label_selector_value(text) is None
        try:
            sel.parse_value("zone", text)
            ours = True
        except ValueError:
            ours = False
        assert ours is ray_ok, text
    for key in KEYS:
        assert (sel.key_error(key) is None) is (label_utils.validate_label_key(key) is None), key
