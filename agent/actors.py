"""What an operator calls a Ray actor: the names in lines, and the app it belongs to."""

from agent.schema.status import ActorBooking


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
