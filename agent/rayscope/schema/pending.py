"""What waits to be placed: the autoscaler state and actor table as read, and the demands
judged from them (``cluster.pending_resources`` is BioEngine's shape, ``cluster.pending``
rayscope's)."""

from typing import Union

import msgspec

from rayscope.schema.report import UNSET, Unset


class LabelConstraint(msgspec.Struct, kw_only=True, gc=False):
    """One constraint of a label selector (Ray's ``LabelSelectorConstraint``): the node's
    label ``key`` is one of ``values`` (``in``) or none of them (``!in``)."""

    key: str
    operator: str
    """``in``, ``!in``, or an operator rayscope does not know, verbatim (never matching)."""
    values: list[str] = []
    """As Ray keeps them (a space written after a comma included)."""


LabelSelector = list[LabelConstraint]
"""Every constraint must hold; empty: any node."""


class PendingNode(msgspec.Struct, kw_only=True, gc=False):
    """One alive node as the autoscaler state holds it, beside the demand it was read with."""

    node_id: str
    node_ip: str = ""
    total: dict[str, float] = {}
    available: dict[str, float] = {}
    labels: dict[str, str] = {}
    """The node's labels as the GCS holds them (``ray.io/node-id`` included, 2.49+)."""


class PendingRequest(msgspec.Struct, kw_only=True, gc=False):
    """One waiting shape of tasks and actors (Ray's pending resource request) and how many."""

    shape: dict[str, float]
    """Ray's names; inside a placement group ``GPU_group_<pg id>`` and ``bundle_group_<pg id>``."""
    count: int = 1
    label_selectors: list[LabelSelector] = []
    """Ray's ``label_selectors`` (2.49+): the first is the selector, the rest its
    ``fallback_strategy`` in order (in the autoscaler state from Ray 2.58)."""


class PendingGang(msgspec.Struct, kw_only=True, gc=False):
    """One placement group that is not placed yet (Ray's pending gang resource request)."""

    bundles: list[dict[str, float]] = []
    details: str = ""
    """``<pg id>:<strategy>|<state>``, as Ray writes it."""
    bundle_selectors: list[LabelSelector] = []
    """Per bundle, in the order of ``bundles``, its ``bundle_label_selector`` (2.49+;
    ``[]`` where the group has none)."""


class PendingActor(msgspec.Struct, kw_only=True, gc=False):
    """One actor the GCS actor table holds as not placed yet. The field names are Ray's state
    API's (``ray list actors``), which BioEngine's ``pending_resources.actors`` carries."""

    actor_id: str
    name: str = ""
    class_name: str = ""
    state: str = "PENDING_CREATION"
    """``PENDING_CREATION`` (waits for resources) or ``DEPENDENCIES_UNREADY``."""
    job_id: str = ""
    required_resources: dict[str, float] = {}
    placement_group_id: str = ""
    """Hex id of the placement group it is to run in; ``""`` for none."""
    label_selector: Union[dict[str, str], Unset] = UNSET
    """Its ``label_selector`` in Ray's syntax, as the actor table holds it (2.49+); absent
    when it has none."""


class PendingRead(msgspec.Struct, kw_only=True, gc=False):
    """What ``gcs_read.read_pending`` read: the demand and the supply of one instant."""

    nodes: list[PendingNode] = []
    requests: list[PendingRequest] = []
    gangs: list[PendingGang] = []
    actors: list[PendingActor] = []
    device_use: dict[str, dict[str, dict[str, float]]] = {}
    """Node id → resource → device index (a string) → what live actors hold there."""
    actor_fallbacks: dict[str, list[LabelSelector]] = {}
    """Actor id → its ``fallback_strategy``'s selectors in order (the actor table's, 2.55+),
    for the actors not placed yet that have one."""


class PendingTask(msgspec.Struct, kw_only=True, gc=False):
    """A waiting task (not an actor) in BioEngine's ``pending_resources.tasks``."""

    required_resources: dict[str, float] = {}
    state: str = "PENDING_NODE_ASSIGNMENT"


class PendingResources(msgspec.Struct, kw_only=True):
    """BioEngine's ``cluster.pending_resources``: lists of dicts and their ``total``."""

    actors: list[PendingActor] = []
    """BioEngine's: ``PENDING_CREATION`` actors that ask for ``CPU``, ``GPU`` or ``memory``
    by those names (``rayscope.core.capacity.pending.bioengine_lists``); rayscope's
    ``pending`` has them all."""
    jobs: list[dict[str, str]] = []
    """Always empty: submitted jobs wait in the dashboard's job manager, not in the GCS
    tables rayscope reads."""
    tasks: list[PendingTask] = []
    """Waiting tasks: the pending requests no waiting actor accounts for, one entry each."""
    total: int = 0
    """``len(actors) + len(jobs) + len(tasks)``, as BioEngine counts it (each list at most
    100 entries, as Ray's state API answers BioEngine)."""


class PendingDemand(msgspec.Struct, kw_only=True):
    """One waiting shape and why it waits (rayscope's own ``cluster.pending``)."""

    kind: str
    """``request`` (tasks and actors) or ``placement_group``."""
    shape: dict[str, float]
    """Ray's names in Ray's order (sorted, as ``ray status`` prints them), placement-group
    suffixes taken off; for a placement group the sum of its bundles."""
    count: int
    names: list[str] = []
    """Names of the waiting actors of this shape (anonymous ones are counted, not named)."""
    jobs: list[str] = []
    bundles: list[dict[str, float]] = []
    """A placement group's bundles, as given."""
    placement_group: str = ""
    """Hex id of the placement group this demand belongs to, or is."""
    strategy: str = ""
    """A placement group's strategy (``PACK``, ``SPREAD``, ``STRICT_PACK``, ``STRICT_SPREAD``)."""
    reason: str
    """``infeasible``, ``fragmented``, ``vram_exhausted``, ``gpu_exhausted``,
    ``cpu_exhausted``, ``memory_exhausted``, ``resource_exhausted``,
    ``waits_placement_group`` or ``waits``, judged on the nodes its label selector admits;
    ``no_label_match`` (no alive node is admitted), ``waits_fallback`` (a fallback selector
    admits a node with room) or ``label_unknown`` (an operator rayscope does not know)."""
    reason_text: str
    by: str = "node_sum"
    """``device``: judged per GPU from the actor table's placement; ``node_sum``: by node
    sums only (the per-GPU placement of the nodes involved is not known)."""
    label_selector: Union[dict[str, str], Unset] = UNSET
    """Its label selector in Ray's syntax (``{"zone": "!in(a,b)"}``); absent when it has none."""
    fallback_selectors: Union[list[dict[str, str]], Unset] = UNSET
    """Its fallback selectors in order; absent when it has none."""
    bundle_selectors: Union[list[dict[str, str]], Unset] = UNSET
    """A placement group's selector per bundle (``{}`` for a bundle without one); absent
    when no bundle has one."""
    admitted_nodes: Union[int, Unset] = UNSET
    """How many alive nodes its label selector admits (the first that admits any, of the
    selector and its fallbacks); absent without a selector."""
