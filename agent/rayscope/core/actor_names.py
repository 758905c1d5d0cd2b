"""What an operator calls a Ray actor: the names in lines, and the app it belongs to."""

import re
from collections import Counter
from collections.abc import Iterable

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


_NUMBERED = re.compile(r"(.+)[-_]\d+")
"""``federated-unet-3``, ``worker_12``, ``resnet50-0``: a replica set named by hand, one name
per replica; the base is everything before the last ``-N`` or ``_N`` (digits in it too)."""

AppKey = tuple[str, str, str]
"""Ray's identity of an app: ``("serve", app, deployment)`` for a Serve replica, ``("named",
class, base name)`` for a named actor, ``("class", class, "")`` for an anonymous one."""


def app_key(class_name: str, name: str) -> AppKey:
    """The app an actor is a replica of, by Ray's own identity of it: a Ray Serve replica's
    application and deployment (told by its class or its name; a BioEngine app is a Serve
    application); else its class together with its name, less a trailing ``-N``/``_N``
    (replicas named by hand); an anonymous actor by its class. A name alone never groups:
    two classes that share a name base are two apps."""
    if class_name.startswith(SERVE_REPLICA_CLASS):
        app, _, deployment = class_name[len(SERVE_REPLICA_CLASS) :].rpartition(":")
        return ("serve", app, deployment)
    if name.startswith(SERVE_REPLICA_NAME):
        parts = name[len(SERVE_REPLICA_NAME) :].split("#")
        if len(parts) >= 3:
            return ("serve", "#".join(parts[:-2]), parts[-2])
    if name:
        numbered = _NUMBERED.fullmatch(name)
        return ("named", class_name, numbered.group(1) if numbered else name)
    return ("class", class_name, "")


def _label(key: AppKey) -> str:
    kind, first, second = key
    if kind == "serve":
        return f"{first}/{second}" if first else second
    if kind == "named":
        return second
    return short_class_name(first) or "actor"


def app_labels(keys: Iterable[AppKey]) -> dict[AppKey, str]:
    """What each app is called in lines, one name per app: a Serve app's ``app/deployment``,
    a named set's base name, an anonymous actor's class; where two apps would read the same,
    the class in brackets after it (``denbi-app (Replica)``, ``Replica (unnamed)``)."""
    keys = sorted(set(keys))
    plain = {key: _label(key) for key in keys}
    clashes = Counter(plain.values())
    return {key: _told_apart(key, label) if clashes[label] > 1 else label for key, label in plain.items()}


def _told_apart(key: AppKey, label: str) -> str:
    """``label`` with what tells its app from another of the same label."""
    if key[0] == "named":
        return f"{label} ({short_class_name(key[1]) or 'no class'})"
    return f"{label} (unnamed)" if key[0] == "class" else label


def app_name(class_name: str, name: str) -> str:
    """The app an actor is a replica of, as lines call it where it is the only one
    (:func:`app_key`'s plain label: ``app/deployment``, the base name, or the class)."""
    return _label(app_key(class_name, name))
