"""The Ray calls of the agents placed through Ray (``rayscope.node.placed_agents``), and nothing else.

A thin adapter: each method is one or two of Ray's own calls, so that the controller that
decides what to place (``rayscope.node.placed_agents``, pure where it can be) imports no ray, and every
Ray API it depends on is listed here. Ray is imported on first use: the head imports it only
when agents are placed through it.
"""

import contextlib
import importlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class NameTaken(Exception):
    """The actor's name is held by another live actor in the namespace."""


def _ray() -> Any:
    """ray itself, imported on first use (ray's own stubs do not cover these calls)."""
    return importlib.import_module("ray")


class RayCluster:
    """One head's connection to the cluster as a Ray driver."""

    def __init__(self, gcs_address: str, namespace: str, py_modules: Sequence[str]) -> None:
        self.gcs_address, self.namespace, self.py_modules = gcs_address, namespace, list(py_modules)
        self._connected = False

    def connect(self) -> None:
        """``ray.init`` once; local modules travel only in a job's runtime environment: the
        head's own job carries them, and every actor it places inherits them."""
        if self._connected:
            return
        if not _ray().is_initialized():
            _ray().init(
                address=self.gcs_address,
                namespace=self.namespace,
                runtime_env={"py_modules": self.py_modules},
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=False,
            )
        self._connected = True

    @property
    def connected(self) -> bool:
        return self._connected

    def named_actors(self) -> list[str]:
        """Names of the live named actors in this head's namespace (any state but DEAD: Ray
        frees a dead actor's name)."""
        entries = _ray().util.list_named_actors(all_namespaces=True)
        return [entry["name"] for entry in entries if entry["namespace"] == self.namespace]

    def node_ip(self) -> str:
        """This process's node IP, as Ray sees it."""
        self.connect()
        return str(_ray().util.get_node_ip_address())

    def place(
        self,
        actor_class: type,
        name: str,
        node_id: str,
        args: Sequence[Any],
        env_vars: Mapping[str, str],
    ) -> Any:
        """A detached, named actor of ``actor_class`` pinned to ``node_id``
        (``NodeAffinitySchedulingStrategy(soft=False)``), booking nothing (``num_cpus=0``, no
        GPU, no custom resource), never restarted by Ray; its handle. :class:`NameTaken` when
        another live actor holds ``name``."""
        strategies: Any = importlib.import_module("ray.util.scheduling_strategies")
        options = (
            _ray()
            .remote(actor_class)
            .options(
                name=name,
                namespace=self.namespace,
                lifetime="detached",
                num_cpus=0,
                num_gpus=0,
                max_restarts=0,
                scheduling_strategy=strategies.NodeAffinitySchedulingStrategy(node_id, soft=False),
                runtime_env={"env_vars": dict(env_vars)},
            )
        )
        try:
            return options.remote(*args)
        except ValueError as err:  # Ray 2.33-2.60: "The name ... is already taken."
            if "already taken" in str(err):
                raise NameTaken(name) from None
            raise

    def call(self, handle: Any, method: str, *args: Any) -> Any:
        """A direct actor call (caller to the actor's worker, not through the GCS): its ref."""
        return getattr(handle, method).remote(*args)

    def kill(self, name: str) -> None:
        """Kill the named actor, if it is there."""
        with contextlib.suppress(ValueError):  # already gone
            _ray().kill(_ray().get_actor(name, namespace=self.namespace), no_restart=True)

    def finished(self, refs: Iterable[Any]) -> set[str]:
        """Hex ids of the refs whose task has finished (without waiting)."""
        pending = list(refs)
        if not pending:
            return set()
        ready, _ = _ray().wait(pending, num_returns=len(pending), timeout=0)
        return {ref.hex() for ref in ready}

    def result(self, ref: Any, timeout_s: float) -> Any:
        """A finished task's value; Ray's error if it failed."""
        return _ray().get(ref, timeout=timeout_s)

    def shutdown(self) -> None:
        if self._connected:
            _ray().shutdown()
            self._connected = False


def this_worker() -> dict[str, Any]:
    """Inside an actor: its node id and the GPU ids Ray gave it (``probe``, for the tests)."""
    return {
        "node_id": _ray().get_runtime_context().get_node_id(),
        "gpu_ids": list(_ray().get_gpu_ids()),
    }
