"""Ray's label selectors: the one parser of their syntax and the one matcher of nodes. Pure.

A selector is what a task, actor or placement-group bundle asks of a node's labels
(``label_selector={"ray.io/accelerator-type": "A100", "zone": "!in(a,b)"}``): every
constraint must hold. Ray's value syntax, as its own parser reads it (its C++
``LabelSelector``, 2.49-2.60): ``v`` (the label is ``v``), ``!v`` (it is not, or the node has
no such label), ``in(a,b)`` and ``!in(a,b)``. The values inside ``in(...)`` are split on
commas and kept as written, spaces included: Ray's own check accepts ``in(a, b)`` and its
scheduler then looks for ``" b"``, which no label has (measured on Ray 2.49, 2.53, 2.55,
2.58 and 2.60), and so does :func:`admits`. An operator this module does not know (one a
later Ray may add, or one the GCS names that is not ``in``/``!in``) is kept verbatim and
never judged as matching (:func:`unknown`).
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

from rayscope.labels import label_pairs, printable
from rayscope.schema.pending import LabelConstraint

IN, NOT_IN = "in", "!in"
NODE_ID_LABEL = "ray.io/node-id"
"""Ray's own label of every node (2.49+): its node id. Its presence tells a Ray that
schedules by labels (2.46-2.48 wrote ``ray.io/node_id`` and ignored selectors)."""

_VALUE = r"[a-zA-Z0-9](?:[a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
"""A label value and a key's name, as Ray checks them (its ``LABEL_REGEX``)."""
_RAY_SELECTOR_VALUE = re.compile(rf"!?(?:in)?\({_VALUE}(?:, ?{_VALUE})*\)|!?{_VALUE}")
"""What Ray's own check (``validate_label_selector_value``) accepts as a selector value."""
_PREFIX = re.compile(rf"(?:{_VALUE})?(?:\.(?:{_VALUE})?)*")
_CALL = re.compile(r"(!?)([A-Za-z_][A-Za-z0-9_-]*)\((.*)\)", re.S)
MAX_CENSUS_VALUES = 4
"""Values of a key a reason names (the most common first); the rest are counted."""
MAX_TEXT_CHARS = 512
"""A selector named in a line: past this it is cut (Ray's keys and values are bounded, a
selector's number of entries is not)."""
MAX_SHOWN_CHARS = 63
"""A label value or key name is at most 63 characters in Ray; anything longer is cut."""


MAX_NODE_LABELS = 64
"""Labels a node's entry in the status document carries (by key; Ray bounds each key and
value, not their number)."""


def shown_labels(labels: Mapping[str, str]) -> Optional[dict[str, str]]:
    """A node's labels as the status document carries them: ``None`` where the GCS gave the
    node none of Ray's own (a Ray before 2.49, whose scheduler ignores selectors); else every
    label but ``ray.io/node-id`` (the node id is the entry's key), printable, each key and
    value cut to Ray's bounds, at most :data:`MAX_NODE_LABELS`."""
    if NODE_ID_LABEL not in labels:
        return None
    kept = sorted((k, v) for k, v in labels.items() if k != NODE_ID_LABEL)[:MAX_NODE_LABELS]
    return {printable(k)[: 253 + 1 + MAX_SHOWN_CHARS]: printable(v)[:MAX_SHOWN_CHARS] for k, v in kept}


def with_node_id(labels: Optional[Mapping[str, str]], node_id: str) -> dict[str, str]:
    """The labels a selector is matched against: :func:`shown_labels`' with ``ray.io/node-id``
    again (a selector may name a node by its id)."""
    return {**(labels or {}), NODE_ID_LABEL: node_id}


def key_error(key: str) -> Optional[str]:
    """Why Ray refuses ``key`` as a label key (its ``validate_label_key``), or ``None``."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        return f"label key {key!r}: its prefix must be DNS labels joined by dots, at most 253 characters"
    if len(name) > 63 or not re.fullmatch(_VALUE, name):
        return (
            f"label key {key!r}: its name must be 1-63 letters, digits, '-', '_' or '.',"
            " beginning and ending with a letter or digit"
        )
    return None


def parse_value(key: str, text: str) -> LabelConstraint:
    """One entry of a selector in Ray's syntax. :class:`ValueError` where Ray refuses it;
    an operator it does not know (``exists()``) is kept verbatim, see :func:`unknown`."""
    why = key_error(key)
    if why is not None:
        raise ValueError(why)
    call = _CALL.fullmatch(text)
    if call is not None and call.group(2) != IN:
        negated, name, inside = call.groups()
        return LabelConstraint(key=key, operator=negated + name, values=inside.split(","))
    if text and not _RAY_SELECTOR_VALUE.fullmatch(text):
        raise ValueError(
            f"{key}={text}: not a selector value Ray accepts (v, !v, in(a,b) or !in(a,b); each value"
            " 1-63 letters, digits, '-', '_' or '.')"
        )
    negated = text.startswith("!")
    body = text[1:] if negated else text
    listed = body.startswith("in(") and body.endswith(")")
    values = body[3:-1].split(",") if listed else [body]  # split as Ray splits: spaces kept
    return LabelConstraint(key=key, operator=NOT_IN if negated else IN, values=values)


def parse(selector: Mapping[str, str]) -> list[LabelConstraint]:
    """A selector as Ray's API takes it (``{"zone": "!in(a,b)"}``), each entry :func:`parse_value`'d."""
    return [parse_value(str(key), str(value)) for key, value in selector.items()]


def parse_read(selector: Mapping[str, str]) -> list[LabelConstraint]:
    """A selector as the GCS holds it in Ray's syntax (the actor table's): :func:`parse`,
    except that a value this module cannot read (a later Ray's syntax) becomes an unknown
    operator holding the text, never an error."""
    out = []
    for key, value in selector.items():
        try:
            out.append(parse_value(str(key), str(value)))
        except ValueError:
            out.append(LabelConstraint(key=str(key), operator=str(value)))
    return out


def same(a: Iterable[LabelConstraint], b: Iterable[LabelConstraint]) -> bool:
    """Whether two selectors ask the same (values compared as sets, as Ray keeps them)."""

    def key(selector: Iterable[LabelConstraint]) -> list[tuple[str, str, list[str]]]:
        return sorted((c.key, c.operator, sorted(set(c.values))) for c in selector)

    return key(a) == key(b)


def unknown(selector: Iterable[LabelConstraint]) -> list[LabelConstraint]:
    """The constraints whose operator this module does not know: never judged as matching."""
    return [c for c in selector if c.operator not in (IN, NOT_IN)]


def holds(constraint: LabelConstraint, labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` meets one constraint, as Ray's scheduler decides:
    ``in``: the label is one of the values; ``!in``: it is none of them, or absent."""
    if constraint.operator == IN:
        return labels.get(constraint.key) in constraint.values
    if constraint.operator == NOT_IN:
        return labels.get(constraint.key) not in constraint.values
    return False


def admits(selector: Iterable[LabelConstraint], labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` meets every constraint (an empty selector admits all)."""
    return all(holds(c, labels) for c in selector)


def _ordered(values: Iterable[str]) -> list[str]:
    # Ray keeps in(...)'s values in a hash set: no order survives; sorted as written, spaces aside.
    return sorted(values, key=lambda v: (v.strip(), v))


def value_text(constraint: LabelConstraint) -> str:
    """The constraint's value in Ray's syntax: ``A100``, ``!T4``, ``in(a,b)``, ``!in(a,b)``;
    an unknown operator as ``name(values)``."""
    values = _ordered(constraint.values)
    if constraint.operator in (IN, NOT_IN):
        bang = "!" if constraint.operator == NOT_IN else ""
        return f"{bang}{values[0]}" if len(values) == 1 else f"{bang}in({','.join(values)})"
    return f"{constraint.operator}({','.join(values)})" if values else constraint.operator


def as_dict(selector: Iterable[LabelConstraint]) -> dict[str, str]:
    """The selector as Ray's API takes it: ``{"zone": "!in(a,b)"}``."""
    return {c.key: value_text(c) for c in selector}


def selector_text(selector: Iterable[LabelConstraint]) -> str:
    """``ray.io/accelerator-type=A100 zone=!in(a,b)``: what a line names (printable, at most
    :data:`MAX_TEXT_CHARS`)."""
    return printable(label_pairs(as_dict(selector)))[:MAX_TEXT_CHARS]


def spaced_values(selector: Iterable[LabelConstraint]) -> list[str]:
    """Values written with a space at an edge (``in(a, b)``): Ray looks for ``" b"`` as written."""
    return [v for c in selector if c.operator in (IN, NOT_IN) for v in c.values if v != v.strip()]


def census(key: str, labels: Sequence[Mapping[str, str]]) -> str:
    """What ``labels`` (one map per alive node) hold for ``key``, bounded: ``zone: b on 2
    nodes, a on 1`` (the commonest :data:`MAX_CENSUS_VALUES` values, then how many more), or
    ``no node has zone``."""
    counts: dict[str, int] = {}
    for node in labels:
        if key in node:
            counts[node[key]] = counts.get(node[key], 0) + 1
    shown_key = printable(key)[: MAX_SHOWN_CHARS * 5]
    if not counts:
        return f"no node has {shown_key}"
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    words = []
    for i, (value, count) in enumerate(ranked[:MAX_CENSUS_VALUES]):
        nodes = "" if i else (" node" if count == 1 else " nodes")
        words.append(f"{printable(value)[:MAX_SHOWN_CHARS]} on {count}{nodes}")
    rest = len(ranked) - MAX_CENSUS_VALUES
    more = f", {rest} more value(s)" if rest > 0 else ""
    without = len(labels) - sum(counts.values())
    missing = f", none on {without}" if without else ""
    return f"{shown_key}: {', '.join(words)}{more}{missing}"


def why_none(selector: Sequence[LabelConstraint], labels: Sequence[Mapping[str, str]]) -> str:
    """Why no node of ``labels`` is admitted, naming the selector and what the nodes hold
    for its keys: ``no alive node has ray.io/accelerator-type=A100 (ray.io/accelerator-type:
    T4 on 2 nodes, G on 1)``. The keys named are those no node meets alone, else all."""
    alone = [c for c in selector if not any(holds(c, node) for node in labels)] or list(selector)
    keys = list(dict.fromkeys(c.key for c in alone))
    text = f"no alive node has {selector_text(selector)} ({'; '.join(census(k, labels) for k in keys)})"
    spaced = spaced_values(selector)
    if spaced:
        text += f"; Ray keeps the space in {printable(repr(spaced[0]))}: write in(...) without spaces"
    return text
