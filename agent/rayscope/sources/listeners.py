"""Who listens on a TCP port of this host, and whether it may be handed a secret
(:func:`untrusted`): the owner (uid) of every listening socket that a connection to an
address of this host and a port could reach, from the kernel's tables ``/proc/net/tcp`` and
``/proc/net/tcp6`` (the rows in state ``0A``, LISTEN; their ``uid`` column), and whether an
address is this host's at all (loopback, or one of its interfaces' addresses, as ``psutil``
lists them).

Both read this process's network namespace: the one a connection from here goes through.
Bounded: each table is read line by line, at most :data:`MAX_TABLE_BYTES`. Never raises: a
table that cannot be read, or is too large, is an owner unknown (:class:`Owners` ``error``),
which the caller treats as untrusted.
"""

import ipaddress
import os
import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Optional, Union

from rayscope.sources import trust
from rayscope.units import MIB

IpAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

PROC_NET = "/proc/net"
LISTEN = "0A"
"""The kernel's ``TCP_LISTEN`` as the tables write it."""
MAX_TABLE_BYTES = 64 * MIB
"""The most of one table read: ~450,000 sockets at the kernel's 150 bytes a row."""
MAX_LINE_BYTES = 512
"""Longer than any row the kernel writes (150 bytes for ``tcp``, 178 for ``tcp6``)."""
LOCALHOST = "localhost"
_ANY4 = ipaddress.IPv4Address("0.0.0.0")
_ANY6 = ipaddress.IPv6Address("::")


class Owners(NamedTuple):
    """The uids of the sockets listening there (empty: none), or why they are unknown."""

    uids: frozenset[int] = frozenset()
    error: str = ""


def addresses_of(host: str) -> Optional[list[IpAddress]]:
    """The addresses ``host`` (a URL's host, IPv6 without brackets) stands for without a
    name lookup: an IP literal itself, ``localhost`` both loopbacks; ``None`` for any other
    name (resolving one is a network call, and its answer anyone's)."""
    if host.lower() == LOCALHOST:
        return [ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1")]
    try:
        return [_plain(ipaddress.ip_address(host.partition("%")[0]))]
    except ValueError:
        return None


def _plain(ip: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return mapped if mapped is not None else ip


def is_here(ip: IpAddress) -> bool:
    """Whether ``ip`` is this host's: loopback, or an address of one of its interfaces (in
    this network namespace); ``False`` when they cannot be listed."""
    if ip.is_loopback:
        return True
    try:
        import psutil  # here: only a published address that is not loopback pays for it

        listed = [entry.address for entries in psutil.net_if_addrs().values() for entry in entries]
    except Exception:  # psutil's listing of the interfaces failed: not known to be here
        return False
    for text in listed:
        try:
            if _plain(ipaddress.ip_address(str(text).partition("%")[0])) == ip:
                return True
        except ValueError:  # a link-layer (MAC) address
            continue
    return False


def _ip_of(field: str) -> IpAddress:
    """A table's address column: 8 (IPv4) or 32 (IPv6) hex digits, each 32-bit word in the
    host's byte order."""
    raw = bytes.fromhex(field)
    if len(raw) not in (4, 16):
        raise ValueError(f"an address of {len(raw)} bytes")
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _plain(ipaddress.ip_address(raw))


def _reaches(local: IpAddress, ips: Sequence[IpAddress]) -> bool:
    """Whether a socket listening on ``local`` takes a connection to one of ``ips``: the
    same address, or a wildcard (``::`` is counted for IPv4 too: without ``IPV6_V6ONLY`` it
    takes both, and the tables do not say)."""
    if local == _ANY6:
        return True
    return any(local == ip or (local == _ANY4 and isinstance(ip, ipaddress.IPv4Address)) for ip in ips)


def listening_uids(lines: Iterable[bytes], ips: Sequence[IpAddress], port: int) -> set[int]:
    """From one table's lines: the uids of the LISTEN rows on ``port`` that reach ``ips``.
    ``ValueError`` for a row that is not the kernel's."""
    uids: set[int] = set()
    for number, line in enumerate(lines):
        fields = line.split()
        if number == 0 or len(fields) < 8 or fields[3] != LISTEN.encode():
            continue  # the header; a row of another state
        address, _, port_hex = fields[1].decode("ascii").partition(":")
        if int(port_hex, 16) == port and _reaches(_ip_of(address), ips):
            uids.add(int(fields[7]))
    return uids


class _TooLarge(Exception):
    pass


def _lines(handle: Iterable[bytes]) -> Iterable[bytes]:
    read = 0
    for line in handle:
        read += len(line)
        if read > MAX_TABLE_BYTES or len(line) > MAX_LINE_BYTES:
            raise _TooLarge
        yield line


def owners(ips: Sequence[IpAddress], port: int, proc_net: str = PROC_NET) -> Owners:
    """The uids of every socket listening on ``port`` of this host that a connection to one
    of ``ips`` could reach, from ``tcp`` and ``tcp6`` under ``proc_net``; never raises."""
    uids: set[int] = set()
    for table in ("tcp", "tcp6"):
        path = f"{proc_net}/{table}"
        try:
            with open(path, "rb") as handle:
                uids |= listening_uids(_lines(handle), ips, port)
        except FileNotFoundError:  # a kernel without IPv6: no tcp6
            if table == "tcp":
                return Owners(error=f"{path} is not there")
        except OSError as err:
            return Owners(error=f"{path} could not be read ({err.strerror or err})")
        except _TooLarge:
            return Owners(error=f"{path} is larger than rayscope reads ({MAX_TABLE_BYTES // MIB} MiB)")
        except (ValueError, UnicodeDecodeError) as err:
            return Owners(error=f"{path} is not the kernel's table ({err})"[:200])
    return Owners(frozenset(uids))


def untrusted(host: str, port: int, me: Optional[int] = None, proc_net: str = PROC_NET) -> str:
    """Why whatever listens at ``host``:``port`` (a URL's host) is not known to be root's or
    ``me``'s (default: this process's effective uid), the rule raylets are trusted by
    (:func:`rayscope.sources.trust.listener_refusal`); ``""`` when it is. Not known: a host
    name, an address of another host (who listens there cannot be checked), a table that
    cannot be read, nothing listening."""
    ips = addresses_of(host)
    if ips is None:
        return f"{host} is a host name, not an address of this host: who listens there cannot be checked"
    if not all(is_here(ip) for ip in ips):
        return f"{host} is not an address of this host: who listens there cannot be checked"
    found = owners(ips, port, proc_net)
    if found.error:
        return f"who listens on port {port} on {host} is unknown: {found.error}"
    if not found.uids:
        return f"nothing listens on port {port} on {host} here"
    me = os.geteuid() if me is None else me
    return trust.listener_refusal(f"port {port} on {host}", found.uids, me) or ""
