"""tests/support/ports.py: a port where nothing listens is held, not probed, and a head's
ports are read from its start-up line.

Positive control: make ``refused_port`` close its socket before returning the number (the
old ``free_port`` of tests/conftest.py) and the bind tests fail: the port can be taken by anyone.
"""

import errno
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ports

BINDERS = {
    "plain": (),
    "SO_REUSEADDR": ((socket.SOL_SOCKET, socket.SO_REUSEADDR),),  # as asyncio's create_server
    "SO_REUSEPORT": ((socket.SOL_SOCKET, socket.SO_REUSEPORT),),
}


def test_a_connect_to_a_refused_port_is_refused() -> None:
    port = ports.refused_port()
    with pytest.raises(ConnectionRefusedError), socket.create_connection((ports.LOOPBACK, port), timeout=5):
        pass


@pytest.mark.parametrize("options", BINDERS.values(), ids=BINDERS.keys())
def test_no_other_socket_can_bind_a_refused_port_while_it_is_held(
    options: tuple[tuple[int, int], ...],
) -> None:
    port = ports.refused_port()
    with socket.socket() as other:
        for level, option in options:
            other.setsockopt(level, option, 1)
        with pytest.raises(OSError) as caught:
            other.bind((ports.LOOPBACK, port))
    assert caught.value.errno == errno.EADDRINUSE


def test_another_process_cannot_listen_on_a_refused_port() -> None:
    """What the race was about: a server of another process (here Python's, with
    ``SO_REUSEADDR`` as most servers set it) taking the port a test relies on being closed."""
    port = ports.refused_port()
    script = f"import socket; socket.create_server(({ports.LOOPBACK!r}, {port}))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1 and "Address already in use" in done.stderr, done.stderr


def test_each_refused_port_is_its_own() -> None:
    assert len({ports.refused_port() for _ in range(5)}) == 5


def test_the_started_line_names_both_ports() -> None:
    line = (
        "2025-01-01 00:00:00 INFO head agent: reports on 127.0.0.1:40123, HTTP on 127.0.0.1:40124,"
        " GCS 127.0.0.1:6379, interval 1 s; up to 1000 agents\n"
    )
    assert ports.started_ports("a line before\n" + line + line.replace("40123", "1")) == (40123, 40124)
    assert ports.started_ports("head agent: starting\n") is None


def test_a_head_on_port_0_names_the_ports_it_listens_on(tmp_path: Path) -> None:
    """A real head started with :data:`ports.HEAD_ON_PORT_0`: :func:`ports.wait_started` reads
    its ports, and both accept connections."""
    from tests.conftest import REPO, base_env

    gcs = f"{ports.LOOPBACK}:{ports.refused_port()}"
    command = [sys.executable, "-m", "rayscope", "head", *ports.HEAD_ON_PORT_0]
    command += ["--gcs", gcs, "--interval", "1"]
    log = tmp_path / "head.log"
    with open(log, "w") as out:
        head = subprocess.Popen(
            command, cwd=REPO, env=base_env(RAY_AUTH_MODE="disabled"), stdout=out, stderr=out
        )
    try:
        started = ports.wait_started(log.read_text, head, timeout_s=60)
        assert 0 not in started and started.listen != started.http
        for port in started:
            socket.create_connection((ports.LOOPBACK, port), timeout=5).close()
    finally:
        head.terminate()
        head.wait(timeout=30)


def test_a_head_that_exits_before_its_line_is_said_so() -> None:
    head = subprocess.Popen(
        [sys.executable, "-c", "print('no head here')"], stdout=subprocess.PIPE, text=True
    )
    out, _ = head.communicate(timeout=60)
    with pytest.raises(RuntimeError, match="the head exited 0 before its start-up line:\nno head here"):
        ports.wait_started(lambda: out, head, timeout_s=5)
