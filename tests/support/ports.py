"""Ports for the tests: each one taken from the OS, none guessed.

A port "probed free" (bind port 0, read the number, close the socket, hand the number on) is
a race: another process can take it before the daemon binds it, or bind it while a test
relies on nothing listening there. So:

* where nothing may listen (a closed GCS, a head that is not there): :func:`refused_port`,
  a port held bound, never listening, for the life of this process;
* a rayscope head: started on ``127.0.0.1:0`` (:data:`HEAD_ON_PORT_0`), its ports read from
  its start-up line (:func:`started_ports`, :func:`wait_started`); agents that push to it
  take its report port from there;
* an in-process fake server: bound to port 0 itself, its port read from ``getsockname()``;
* Ray's own ports: :func:`free_port_for_ray`, the one exception (see there).

Only the standard library here: ``tests/livecluster.py`` imports this module under the
Python of every Ray release ``make compat`` runs (3.9 with Ray 2.33).
"""

import atexit
import re
import socket
import subprocess
from typing import Any, Callable, NamedTuple, Optional

from tests.waiting import eventually

LOOPBACK = "127.0.0.1"
ANY_PORT = f"{LOOPBACK}:0"
"""A loopback address whose port the OS picks when it is bound."""
HEAD_ON_PORT_0 = ("--listen", ANY_PORT, "--http", ANY_PORT)
"""``rayscope head``'s options for both its ports on ports the OS picks."""

_HELD: list[socket.socket] = []


def refused_port() -> int:
    """A loopback TCP port where a connect is refused and which no other socket can take.

    A socket bound to 127.0.0.1:0 without ``SO_REUSEADDR`` and never listening, kept open
    until this process exits: a connect gets ECONNREFUSED (the kernel answers a SYN to a
    port nobody listens on with a reset), another bind of the port fails with EADDRINUSE,
    whatever options it sets, and the kernel never hands the port out as the source port of
    a connect (which could otherwise connect to itself on a closed port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
    except BaseException:
        sock.close()
        raise
    _HELD.append(sock)
    return int(sock.getsockname()[1])


@atexit.register
def _let_go() -> None:
    """Close the held sockets before the interpreter's teardown collects them (a socket
    collected open is a ResourceWarning, an error under the suite's warning filter)."""
    while _HELD:
        _HELD.pop().close()


STARTED_LINE = re.compile(r"head agent: reports on [^ ]+:(\d+), HTTP on [^ ]+:(\d+),")
"""The head's start-up line, which names the ports it listens on (the OS's, for port 0)."""


class HeadPorts(NamedTuple):
    listen: int
    """The report port (``--listen``): where ``rayscope push`` connects."""
    http: int
    """The HTTP port (``--http``)."""


def started_ports(text: str) -> Optional[HeadPorts]:
    """The ports named by the first start-up line in ``text`` (a head's log or output);
    None while it has none."""
    found = STARTED_LINE.search(text)
    return HeadPorts(int(found.group(1)), int(found.group(2))) if found else None


def wait_started(
    log: Callable[[], str], process: "subprocess.Popen[Any]", timeout_s: float = 30.0, every_s: float = 0.1
) -> HeadPorts:
    """The ports of the head ``process`` once its start-up line is in ``log()`` (only this
    head's part of the log: a shared log holds earlier heads' lines); RuntimeError if it
    exits first, AssertionError past ``timeout_s``."""

    def started() -> Optional[HeadPorts]:
        if process.poll() is not None:
            raise RuntimeError(f"the head exited {process.returncode} before its start-up line:\n{log()}")
        return started_ports(log())

    return eventually(started, timeout_s, "the head's start-up line", every_s, detail=log)


def free_port_for_ray() -> int:
    """A port nothing listens on right now, for an option of Ray's that must be given a
    number: the one place the suite still probes (bind port 0, read, close).

    Ray cannot be given port 0 for these across the supported releases (2.33 to 2.60), and
    leaving them out does not help: ``ray start --dashboard-agent-listen-port`` defaults to
    the fixed 52365 in both 2.33 and 2.60, ``--port`` (the GCS) to 6379, ``--dashboard-port``
    to 8265 and ``--ray-client-server-port`` to 10001, so two clusters on one host would
    collide; where Ray picks
    a port itself when the option is left out (``--dashboard-agent-grpc-port``,
    ``--runtime-env-agent-port``, ``--metrics-export-port``), 2.33 does it with this same
    probe (``Node._get_unused_port``, cached in its session directory), and only 2.60's
    agents bind port 0 themselves. The GCS port is also needed before start: a test that
    restarts the GCS restarts it on the same port. Never use this for a rayscope daemon
    (port 0 and its start-up line) or for a port where nothing may listen
    (:func:`refused_port`)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])
