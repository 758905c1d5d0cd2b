"""Why a demand with label selectors waits: judged on the nodes its selectors admit. Pure.

A task or actor names a selector and, with ``fallback_strategy``, fallbacks Ray tries in
order; a placement group names one per bundle (``bundle_label_selector``). Ray places a
demand only on a node its selector admits (:mod:`rayscope.core.capacity.selectors`), so the
reasons of :mod:`rayscope.core.capacity.reasons` are asked about those nodes only, and the
text says which selector admitted how many. Before that, two reasons of its own:

* ``no_label_match``: no alive node is admitted, by the selector nor any fallback: the text
  names the selector and what the nodes hold for its keys (``no alive node has
  ray.io/accelerator-type=A100 (ray.io/accelerator-type: T4 on 2 nodes, G on 1)``);
* ``label_unknown``: a selector names an operator rayscope does not know: not judged;

and one after: ``waits_fallback``, where the selector's nodes have no room but a fallback
admits a node with room now: Ray will put it there.
"""

from collections.abc import Mapping, Sequence

from rayscope.core.capacity import selectors as sel
from rayscope.core.capacity.reasons import (
    DeviceFree,
    Judgement,
    bundle_total,
    canonical,
    has_room,
    judge,
    judge_gang,
)
from rayscope.labels import node_label
from rayscope.schema.pending import LabelSelector, PendingNode


def _unknown(options: Sequence[LabelSelector]) -> Judgement:
    bad = next(c for option in options for c in sel.unknown(option))
    shown = sel.selector_text([bad])
    return Judgement(
        "label_unknown", f"its label selector names an operator rayscope does not know ({shown}): not judged"
    )


def _admits(option: LabelSelector, nodes: Sequence[PendingNode]) -> list[PendingNode]:
    return [n for n in nodes if sel.admits(option, n.labels)]


def _none_admitted(options: Sequence[LabelSelector], nodes: Sequence[PendingNode]) -> str:
    text = sel.why_none(options[0], [n.labels for n in nodes])
    fallbacks = [sel.selector_text(o) for o in options[1:]]
    return text + (
        f"; nor its fallback{'s' if len(fallbacks) > 1 else ''} {', '.join(fallbacks)}" if fallbacks else ""
    )


def _on(option: LabelSelector, admitted: int, alive: int) -> str:
    return f"{sel.selector_text(option)} admits {admitted} of {alive} alive node(s)"


def judge_selected(
    shape: Mapping[str, float],
    options: Sequence[LabelSelector],
    nodes: Sequence[PendingNode],
    device_free: DeviceFree,
) -> tuple[Judgement, int]:
    """Why ``shape`` with its selector and fallbacks (``options``, in Ray's order) does not
    run now, and how many alive nodes the deciding selector admits. ``options`` not empty."""
    if any(sel.unknown(option) for option in options):
        return _unknown(options), 0
    admitted = [_admits(option, nodes) for option in options]
    if not any(admitted):
        return Judgement("no_label_match", _none_admitted(options, nodes)), 0
    judged = [judge(shape, group, device_free) if group else None for group in admitted]
    for i, judgement in enumerate(judged):
        if judgement is None or judgement.reason != "waits":
            continue
        if i == 0:
            return Judgement(
                "waits", f"{_on(options[0], len(admitted[0]), len(nodes))}: {judgement.text}", judgement.by
            ), len(admitted[0])
        room = next((n for n in admitted[i] if has_room(n, shape)), admitted[i][0])
        text = (
            f"no node its selector {sel.selector_text(options[0])} admits has room now; its fallback"
            f" {sel.selector_text(options[i])} admits {node_label(room.node_ip, room.node_id)} with room:"
            " it will land on the fallback"
        )
        return Judgement("waits_fallback", text, judgement.by), len(admitted[i])
    first = next(i for i, group in enumerate(admitted) if group)
    judgement = judged[first]
    assert judgement is not None
    where = _on(options[first], len(admitted[first]), len(nodes))
    if first > 0:
        where = f"{_none_admitted(options[:first], nodes)}; its fallback {where}"
    return Judgement(judgement.reason, f"{where}: {judgement.text}", judgement.by), len(admitted[first])


def judge_gang_selected(
    bundles: Sequence[Mapping[str, float]],
    per_bundle: Sequence[LabelSelector],
    strategy: str,
    nodes: Sequence[PendingNode],
    device_free: DeviceFree,
) -> Judgement:
    """Why a placement group whose bundles name selectors (``per_bundle``, in the order of
    ``bundles``; ``[]`` for a bundle without one) is not placed: each bundle only on nodes
    its selector admits; all on one node for ``STRICT_PACK``."""
    if any(sel.unknown(option) for option in per_bundle):
        return _unknown(per_bundle)
    admitted = [_admits(option, nodes) for option in per_bundle]
    for i, group in enumerate(admitted):
        if not group:
            return Judgement("no_label_match", f"bundle {i}: {_none_admitted([per_bundle[i]], nodes)}")
    if strategy == "STRICT_PACK" or len(bundles) <= 1:
        every = [n for n in nodes if all(sel.admits(option, n.labels) for option in per_bundle)]
        if not every:
            text = (
                "STRICT_PACK: no alive node is admitted by every bundle's selector ("
                + "; ".join(
                    f"bundle {i}: {sel.selector_text(o)} admits {len(g)}"
                    for i, (o, g) in enumerate(zip(per_bundle, admitted))
                )
                + ")"
            )
            return Judgement("no_label_match", text)
        judgement = judge(canonical(bundle_total(bundles)), every, device_free)
        return Judgement(
            judgement.reason,
            f"{len(every)} of {len(nodes)} alive node(s) admit every bundle: {judgement.text}",
            judgement.by,
        )
    return judge_gang(bundles, strategy, nodes, device_free, admitted)
