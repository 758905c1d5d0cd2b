"""``HOST:PORT`` addresses and the default deadline: what the CLI validates before it knows
which source it will read. Pure and light (the CLI's start-up pays for every import)."""

from rayscope.defaults import DEFAULT_GCS_PORT, RAY_CLIENT_PORT
from rayscope.units import is_count, parse_count


def with_port(text: str, default_port: int) -> str:
    """``HOST`` → ``HOST:default_port`` (``[v6]`` too); an address with a port unchanged."""
    stripped = text.strip()
    if stripped.endswith("]") or ":" not in stripped:
        return f"{stripped}:{default_port}"
    return stripped


def parse_address(text: str, any_port: bool = False) -> str:
    """Validate ``host:port`` (``[v6]:port`` too); raise ``ValueError`` saying what is wrong
    (a URL, as Ray's dashboard address is written: its scheme named, the address without it).
    ``any_port``: an address to listen on, where port 0 asks the OS for a free one."""
    scheme, sep, rest = text.strip().partition("://")
    if sep and scheme.isalpha():
        bare = rest.split("/", 1)[0]
        raise ValueError(f"{text!r} is a URL: give HOST:PORT without {scheme}:// ({bare or 'HOST:PORT'})")
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not HOST:PORT")
    if not is_count(port) or not (0 if any_port else 1) <= parse_count(port, "port") < 65536:
        free = ", or 0 for any free port" if any_port else ""
        raise ValueError(f"{text!r}: port must be a number from 1 to 65535{free}")
    if any(c.isspace() for c in host) or "/" in host:
        raise ValueError(f"{text!r}: not a host name or IP address")
    return f"{host}:{parse_count(port, 'port')}"


def parse_gcs_address(text: str) -> str:
    """``HOST[:PORT]`` of a GCS (6379 when no port is given), checked by :func:`parse_address`;
    a ``ray://`` address is Ray Client's, not the GCS: the ``ValueError`` says where the GCS
    usually is instead."""
    scheme, sep, rest = text.strip().partition("://")
    if sep and scheme.lower() == "ray":
        host = rest.split("/", 1)[0].rpartition(":")[0] or rest.split("/", 1)[0] or "HOST"
        raise ValueError(
            f"{text!r} is a Ray Client address (ray.init's ray://; its server listens on"
            f" {RAY_CLIENT_PORT} by default), not the GCS: rayscope reads the GCS, usually"
            f" {host}:{DEFAULT_GCS_PORT}"
        )
    return parse_address(with_port(text, DEFAULT_GCS_PORT))


def split_address(address: str) -> tuple[str, int]:
    """``"[::1]:6379"`` → ``("::1", 6379)``; the address must have passed :func:`parse_address`."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), parse_count(port, f"port of {address!r}", 65535)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine's
    loopback: ``localhost``, ``127.0.0.0/8``, ``::1``."""
    bare = host.strip("[]")
    return bare in ("localhost", "::1") or bare.startswith("127.")
