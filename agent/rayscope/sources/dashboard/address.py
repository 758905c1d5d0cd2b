"""Where Ray's dashboard is, and whether Ray's token may go there.

The address (:func:`choose_address`): ``--dashboard URL``, else ``$RAYSCOPE_DASHBOARD``, else
what the cluster published in the GCS (read by the GCS child in the same connection:
``raycompat.dashboard_url``); ``none`` turns the source off. Ray's token is found the way Ray's
own clients find it (:func:`ray_token`) and goes only to a listener that is the dashboard
(:func:`token_withheld`).
"""

import os
from collections.abc import Mapping
from typing import NamedTuple, Optional
from urllib.parse import urlsplit

from rayscope.defaults import DASHBOARD_ENV
from rayscope.labels import printable
from rayscope.net.tokens import check_token, read_token_file
from rayscope.schema.dashboard import DASHBOARD_OFF
from rayscope.sources import listeners
from rayscope.sources.dashboard.get import DEFAULT_PORT
from rayscope.sources.gcs import read as gcs_read
from rayscope.units import parse_count

RAY_TOKEN_MIN_BYTES = 1
"""Ray's token is Ray's to size: rayscope forwards it and imposes no length of its own."""
OFF = "none"
"""``--dashboard none`` / ``RAYSCOPE_DASHBOARD=none``: the source is not read."""
NO_DASHBOARD_FIX = "install ray[default] on the head (its dashboard), or run a rayscope node agent"


class Address(NamedTuple):
    url: str
    """``http[s]://HOST:PORT[/prefix]``, no trailing slash."""
    origin: str
    """``--dashboard``, ``$RAYSCOPE_DASHBOARD`` or ``GCS``: where it was found."""


def parse_url(text: str) -> str:
    """``HOST[:PORT]`` or ``http[s]://HOST[:PORT][/prefix]`` → the dashboard's base URL;
    ``ValueError`` saying what is wrong (the text quoted, so controls show escaped)."""
    stripped = text.strip()
    if (
        not stripped
        or len(stripped) > 2048
        or not (stripped.isascii() and stripped.isprintable())
        or " " in stripped
    ):
        raise ValueError(f"{text[:80]!r} is not a dashboard URL (http://HOST:PORT)")
    url = urlsplit(stripped if "://" in stripped else f"http://{stripped}")
    if url.scheme not in ("http", "https") or not url.hostname or url.username or url.query or url.fragment:
        raise ValueError(f"{text[:80]!r} is not a dashboard URL (http://HOST:PORT)")
    after_host = url.netloc.rpartition("]")[2]  # past an IPv6 literal's brackets
    port = DEFAULT_PORT
    if ":" in after_host:
        port = parse_count(after_host.rpartition(":")[2], f"dashboard URL {text[:80]!r}: port", 65535)
    if port == 0:
        raise ValueError(f"dashboard URL {text[:80]!r}: port must be a number from 1 to 65535")
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{port}{url.path.rstrip('/')}"


def choose_address(
    option: Optional[str], environ: Mapping[str, str], published: Optional[str], published_error: str
) -> tuple[Optional[Address], str]:
    """The dashboard to read and where it was found, or ``(None, why none)``.

    ``option`` (``--dashboard``) wins, then ``$RAYSCOPE_DASHBOARD``, then ``published`` (the
    GCS's text, checked here like any peer's); ``none`` in either of the first two turns the
    source off. An operator's bad URL is a ``ValueError`` naming where it came from; a bad
    published one is a reason."""
    for given, origin in ((option, "--dashboard"), (environ.get(DASHBOARD_ENV), f"${DASHBOARD_ENV}")):
        if given is None or not given.strip():
            continue
        if given.strip().lower() == OFF:
            return None, f"{DASHBOARD_OFF} ({origin} {OFF})"
        try:
            return Address(parse_url(given), origin), ""
        except ValueError as err:
            raise ValueError(f"{origin}: {err}") from None
    if published is None:
        why = published_error or "the cluster published no dashboard address"
        return None, f"no Ray dashboard: {why}; {NO_DASHBOARD_FIX}"
    try:
        return Address(parse_url(published), "GCS"), ""
    except ValueError:
        shown = printable(published)[:80]
        return None, f"the cluster published a dashboard address that is not one ({shown!r})"


def ray_token(environ: Mapping[str, str]) -> tuple[Optional[bytes], str]:
    """Ray's auth token as Ray's own clients find it (``RAY_AUTH_TOKEN``, then the file at
    ``RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``; none with ``RAY_AUTH_MODE`` other
    than ``token``) and where it came from; ``ValueError`` (one line) for a bad one."""
    env = dict(environ)
    found = gcs_read.prepare_auth_env(env)  # the one rule of where Ray's token comes from
    if found is None or env.get(gcs_read.AUTH_MODE) != "token":
        return None, ""
    if found == "RAY_AUTH_TOKEN":
        return check_token(
            env["RAY_AUTH_TOKEN"].encode("utf-8", "replace"), "$RAY_AUTH_TOKEN", RAY_TOKEN_MIN_BYTES
        ), found
    path = env["RAY_AUTH_TOKEN_PATH"] if found == "RAY_AUTH_TOKEN_PATH" else os.path.expanduser(found)
    return read_token_file(path, shared_read=True, min_bytes=RAY_TOKEN_MIN_BYTES), found


def token_withheld(address: Address, me: Optional[int] = None, proc_net: str = listeners.PROC_NET) -> str:
    """Why Ray's token must not go to ``address`` (``""``: it may): the one rule of every
    read that sends it (``status``, ``fit``, ``rayscope.cluster_state()``, the head's polls).
    To an address the operator named, always; to one the GCS published (which it keeps after
    the dashboard is gone), only when root or ``me`` (default: this process's effective uid)
    listens there on this host (:func:`rayscope.sources.listeners.untrusted`)."""
    if address.origin != "GCS":
        return ""
    url = urlsplit(address.url)
    return listeners.untrusted(url.hostname or "", url.port or DEFAULT_PORT, me, proc_net)
