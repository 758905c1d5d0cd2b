"""What an operator calls a Ray actor: the names in lines, and the app it belongs to."""

import re

from rayscope.schema.status import ActorBooking


def short_class_name(class_name: str) -> str:
    """``LiveCluster.place.<locals>.Replica`` → ``Replica``; Serve's ``ServeReplica:app:dep`` stays."""
    return class_name.rsplit(".", 1)[-1] if class_name else ""


SERVE_REPLICA_CLASS = "ServeReplica:"
"""Ray Serve's replica actors: class ``ServeReplica:<app>:<deployment>``, named
``SERVE_REPLICA::<app>#<deployment>#<suffix>``."""


def actor_name(actor: ActorBooking) -> str:
    """What the operator calls the actor: a Serve replica's deployment, else its name, else
    its class."""
    if actor.class_name.startswith(SERVE_REPLICA_CLASS):
        return actor.class_name.rsplit(":", 1)[-1]
    return actor.name or short_class_name(actor.class_name) or "actor"


SERVE_REPLICA_NAME = "SERVE_REPLICA::"


_NUMBERED = re.compile(r"(.*[^\d_-])[-_]\d+")
"""``federated-unet-3``, ``worker_12``: a replica set named by hand, one name per replica."""


def app_name(class_name: str, name: str) -> str:
    """The app an actor is a replica of, for grouping: ``app/deployment`` for a Ray Serve
    replica (a BioEngine app is a Serve application: its id is the app, each of its
    deployments books its own replicas), told by its class or its name; a named actor whose
    name ends in ``-N`` or ``_N``: the name without it; else its class."""
    if class_name.startswith(SERVE_REPLICA_CLASS):
        app, _, deployment = class_name[len(SERVE_REPLICA_CLASS) :].rpartition(":")
        return f"{app}/{deployment}" if app else deployment
    if name.startswith(SERVE_REPLICA_NAME):
        parts = name[len(SERVE_REPLICA_NAME) :].split("#")
        if len(parts) >= 3:
            return f"{'#'.join(parts[:-2])}/{parts[-2]}"
    numbered = _NUMBERED.fullmatch(name)
    if numbered:
        return numbered.group(1)
    return short_class_name(class_name) or name or "actor"
