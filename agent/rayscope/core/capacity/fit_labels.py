"""``fit --label-selector``: which nodes a request's label selector lets it go to. Pure.

The selector is Ray's (``label_selector={"zone": "!in(a,b)"}``, parsed and matched by
:mod:`rayscope.core.capacity.selectors`); only the alive nodes it admits are candidates, per
device as ever. A selector that admits none does not fit, with one line naming it and what
the nodes hold for its keys. A cluster whose Ray gives its nodes no labels (before 2.49) or
a selector operator rayscope does not know: could not tell (exit 2).
"""

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Optional

import msgspec

from rayscope.core.capacity import selectors as sel
from rayscope.defaults import CLUSTER_RAY
from rayscope.errors import EXIT_NO_DATA, EXIT_USAGE, AgentError
from rayscope.schema.fit import FitRequest
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import NodeStatus

LABELS_SINCE = "2.49"
"""The first Ray release whose nodes carry labels of Ray's own and whose scheduler honours
selectors (measured: 2.46 ran an actor selecting a label no node had)."""


def label_options(values: Sequence[str]) -> dict[str, str]:
    """``--label-selector KEY=VALUE`` (repeatable) as Ray's selector dict, checked."""
    selector: dict[str, str] = {}
    for value in values:
        key, equals, text = value.partition("=")
        if not equals:
            raise AgentError(
                f"--label-selector {value}: give KEY=VALUE (e.g. zone=b, zone=!in(a,b))", EXIT_USAGE
            )
        if key in selector:
            raise AgentError(
                f"--label-selector: {key} given twice (one value per key, as in Ray)", EXIT_USAGE
            )
        selector[key] = text
    return selector


def with_label_selector(request: FitRequest, selector: Optional[Mapping[str, str]]) -> FitRequest:
    """``request`` asking only nodes ``selector`` admits (``None`` or empty: any node); a
    selector Ray would refuse is a usage error (exit 2) saying why."""
    if not selector:
        return request
    try:
        sel.parse(selector)
    except ValueError as err:
        raise AgentError(f"--label-selector: {err}", EXIT_USAGE) from None
    return msgspec.structs.replace(request, label_selector={str(k): str(v) for k, v in selector.items()})


def cluster_release(sources: Sequence[SourceStatus]) -> str:
    """The cluster's Ray release as the ``ray`` source says it, or ``""``."""
    for source in sources:
        if source.name == "ray" and source.detail.startswith(CLUSTER_RAY):
            release = source.detail[len(CLUSTER_RAY) :].split(",", 1)[0]
            return "" if release == "unknown" else release
    return ""


class Admitted(NamedTuple):
    nodes: list[NodeStatus]
    """The candidates: every node without a selector, else those it admits."""
    miss: str = ""
    """Why none is admitted (``no alive node has zone=x (zone: a on 2 nodes)``); ``""``."""


def admitted(request: FitRequest, nodes: Sequence[NodeStatus], sources: Sequence[SourceStatus]) -> Admitted:
    """The nodes ``request``'s label selector admits, of the alive ``nodes``."""
    if not isinstance(request.label_selector, dict):
        return Admitted(list(nodes))
    selector = sel.parse(request.label_selector)
    strange = sel.unknown(selector)
    if strange:
        raise AgentError(
            f"could not tell: --label-selector {sel.selector_text(strange)}: an operator rayscope does"
            " not know (Ray's are v, !v, in(a,b), !in(a,b))",
            EXIT_NO_DATA,
        )
    labelled = [n for n in nodes if isinstance(n.labels, dict)]
    if not labelled:
        release = cluster_release(sources)
        which = f"Ray {release}" if release else "this cluster's Ray"
        raise AgentError(
            f"--label-selector: {which} gives its nodes no labels (labels and label selectors came"
            f" in Ray {LABELS_SINCE})",
            EXIT_NO_DATA,
        )
    labels = [sel.with_node_id(n.labels if isinstance(n.labels, dict) else None, n.node_id) for n in labelled]
    chosen = [n for n, node_labels in zip(labelled, labels) if sel.admits(selector, node_labels)]
    return Admitted(chosen, "" if chosen else sel.why_none(selector, labels))
