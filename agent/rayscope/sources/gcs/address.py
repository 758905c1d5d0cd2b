"""Where the GCS address comes from, in order: ``--gcs``, ``$RAYSCOPE_GCS``, ``$RAY_ADDRESS``
(as ``ray.init()`` reads it), a local raylet's command line, ``<ray temp
dir>/ray_current_cluster`` — a raylet or a file only when root or the invoking user owns it
(SECURITY.md, rule 1): the Ray token travels with the connection.
"""

import os
from collections.abc import Mapping, Sequence
from typing import Optional

from rayscope.defaults import DEFAULT_GCS_PORT, GCS_ADDRESS_ENV, RAY_ADDRESS_ENV
from rayscope.net.addresses import parse_gcs_address, with_port
from rayscope.schema.report import RayletInfo
from rayscope.sources import trust

ADDRESS_FILE = "ray_current_cluster"


def ray_temp_dir(environ: Mapping[str, str]) -> str:
    """Ray's own rule: ``$RAY_TMPDIR``, else ``$TMPDIR``, else ``/tmp``; then ``/ray``.
    The environment is the invoking user's, so trusted; the directory it names is not."""
    return os.path.join(environ.get("RAY_TMPDIR") or environ.get("TMPDIR") or "/tmp", "ray")


MAX_ADDRESS_FILE_BYTES = 4096


def address_from_file(environ: Mapping[str, str]) -> tuple[Optional[str], str]:
    """(the address ``ray start`` wrote for local drivers, why there is none).

    ``<ray temp dir>/ray_current_cluster`` is read only when root or this user owns it and
    every directory above it, and nobody else can write them (SECURITY.md, rule 1:
    :func:`trust.open_trusted`): under a world-writable ``/tmp`` anyone can create ``ray/``
    first and name their own port, and root would send its Ray token there. A FIFO is
    refused at once, never waited on."""
    path = os.path.join(ray_temp_dir(environ), ADDRESS_FILE)
    try:
        fd = trust.open_trusted(path, os.geteuid())
    except trust.Refused as refusal:
        return None, f"refused {path}: {refusal}"
    except (FileNotFoundError, NotADirectoryError):
        return None, f"no {ADDRESS_FILE} file in {os.path.dirname(path)}"
    except OSError as err:
        return None, f"cannot read {path}: {err.strerror}"
    try:
        data = os.read(fd, MAX_ADDRESS_FILE_BYTES)
    except OSError as err:
        return None, f"cannot read {path}: {err.strerror}"
    finally:
        os.close(fd)
    address = data.decode("utf-8", "replace").strip()
    return (address, "") if address else (None, f"{path} is empty")


RAY_FINDS_IT = ("", "auto", "local")
"""``$RAY_ADDRESS`` values that name no address: the cluster found on this host (``local``
starts a new one for ``ray.init()``; rayscope starts nothing, so it reads the one here)."""


def from_environment(environ: Mapping[str, str]) -> tuple[Optional[str], str, str]:
    """(address, where it came from or why it is refused, why ``$RAY_ADDRESS`` was passed
    over) from ``$RAYSCOPE_GCS``, else ``$RAY_ADDRESS`` as ``ray.init()`` reads it:
    ``HOST[:PORT]`` is the GCS (a missing port is Ray's default, as for ``--gcs``; the rest
    is checked by ``collect.resolve_gcs``); ``ray://`` is Ray Client's, refused with where the
    GCS usually is; ``auto``, ``local`` and a dashboard URL (``http://``: the Jobs CLI's
    convention) name no GCS."""
    if environ.get(GCS_ADDRESS_ENV):
        return with_port(environ[GCS_ADDRESS_ENV], DEFAULT_GCS_PORT), GCS_ADDRESS_ENV, ""
    value = environ.get(RAY_ADDRESS_ENV, "").strip()
    if value.lower() in RAY_FINDS_IT:
        return None, "", ""
    if value.lower().startswith(("http://", "https://")):
        return None, "", f"{RAY_ADDRESS_ENV}={value} is a dashboard URL (ray job's), not the GCS"
    try:
        return parse_gcs_address(value), RAY_ADDRESS_ENV, ""
    except ValueError as err:
        return None, f"bad GCS address from {RAY_ADDRESS_ENV}: {err}", ""


def resolve_address(
    explicit: Optional[str],
    environ: Mapping[str, str],
    raylets: Sequence[RayletInfo],
    refused_raylets: str = "",
) -> tuple[Optional[str], str]:
    """(address, where it came from); ``(None, why)`` when no source names one.

    ``raylets`` are those :func:`rayscope.sources.raylet.find_raylets` trusts (root's or this
    user's: another user's raylet is no source of the address); ``refused_raylets`` says
    which it refused and why, for the message when nothing else names a cluster. The Ray
    token goes to the address returned, so every source here is one only root or this user
    controls: ``--gcs``, the environment, those raylets, a trusted address file."""
    if explicit:
        return explicit, "--gcs"
    from_env, origin, passed_over = from_environment(environ)
    if from_env is not None or origin:
        return from_env, origin
    from_raylets = sorted({r.gcs_address for r in raylets if r.gcs_address})
    if len(from_raylets) > 1:
        clusters = ", ".join(from_raylets)
        return None, f"raylets of {len(from_raylets)} clusters run on this host ({clusters}): pass --gcs"
    if from_raylets:
        pids = ", ".join(str(r.pid) for r in raylets if r.gcs_address)
        return from_raylets[0], f"raylet pid {pids}"
    from_file, why_not = address_from_file(environ)
    if from_file:
        return from_file, os.path.join(ray_temp_dir(environ), ADDRESS_FILE)
    no_raylet = refused_raylets or "no raylet process on this host"
    why = "; ".join(filter(None, [passed_over, no_raylet, why_not]))
    return None, f"no GCS address: pass --gcs HOST:PORT or set {GCS_ADDRESS_ENV} ({why})"
