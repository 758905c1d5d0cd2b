"""A new operator's mistakes, each with its exact one-line answer and exit code.

Every case runs ``python -m rayscope`` in its own process with stderr a pipe (as cron and
``grep`` see it): stderr must be exactly one line, ``rayscope: ...``, and stdout empty. The
"before" of each case is in its comment: what the same input answered before this table.

The cases that need a peer use a real ``rayscope head`` (``head_daemon``: its GCS a closed
port), a TCP server that speaks first the way Ray's GCS does (an HTTP/2 SETTINGS frame, the
bytes recorded from Ray 2.60's GCS), and a ``rayscope push`` whose warning line is read.
Positive control: drop the ``peer.wrong_http_port`` call in ``head_request.get`` (its
``NotHttp`` branch) and the report-port case says only "answered something that is not HTTP"
(no port named); the line before this change quoted the peer: "head agent unreachable at
... (" and the challenge bytes.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, base_env, push_once_a_second, run_rayscope
from tests.support import fake_server
from tests.support.ports import refused_port

DAY = "give more than 0 and at most 86400 seconds"
GPU_MB = "give more than 0 and at most 1048576 MB, or -1 for a whole GPU"
UNUSED_TOKEN = (
    "--token-file without --head: the token is a head agent's, and the GCS read takes Ray's own"
    " ($RAY_AUTH_TOKEN_PATH): drop --token-file, or read a head with --head URL"
)
RAY_GCS_SETTINGS = bytes.fromhex("000018040000000000000400400000000500400000000600004000fe0300000001")
"""What Ray 2.60's GCS sends on accept, before any request (an HTTP/2 SETTINGS frame)."""


def one_line(done: "subprocess.CompletedProcess[str]") -> str:
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("rayscope: ")
    return lines[0][len("rayscope: ") :]


# (argv, exit code, the whole line after "rayscope: "). Addresses here are syntax only: each
# line is a usage error said before anything is dialled (so 127.0.0.1:1 and :2 may stay
# literal, not tests/support/ports.py's refused_port), and the test ids are made of them.
USAGE = [
    # before: "internal error: ValueError" (exit 1); then "... nan is not a number of seconds"
    (["status", "--timeout", "nan"], 2, f"status --timeout nan: not a finite number: {DAY}"),
    # before: "internal error: OverflowError" (exit 1)
    (["status", "--timeout", "inf"], 2, f"status --timeout inf: not a finite number: {DAY}"),
    (["status", "--timeout", "0"], 2, f"status --timeout 0: {DAY}"),
    (["status", "--watch", "-1"], 2, f"status --watch -1: {DAY}"),
    # before: "internal error: ValueError"
    (["push", "--head", "h:1", "--interval", "nan"], 2, f"push --interval nan: not a finite number: {DAY}"),
    # before: accepted, then the GCS polled in a busy loop (73% CPU)
    (["head", "--interval", "nan"], 2, f"head --interval nan: not a finite number: {DAY}"),
    # before: accepted ("Fits: yes")
    (
        ["fit", "--gpu-memory-mb", "1", "--num-cpus", "nan"],
        2,
        "fit --num-cpus nan: not a finite number: give 0 to 65536 CPUs",
    ),
    (["fit", "--gpu-memory-mb", "1", "--num-cpus", "-1"], 2, "fit --num-cpus -1: give 0 to 65536 CPUs"),
    (
        ["fit", "--gpu-memory-mb", "1", "--memory-mb", "inf"],
        2,
        "fit --memory-mb inf: not a finite number: give 0 to 67108864 MB",
    ),
    (
        ["fit", "--gpu-memory-mb", "1", "--gpu-total-mb", "nan"],
        2,
        "fit --gpu-total-mb nan: not a finite number: give 1 to 1048576 MB",
    ),
    (
        ["fit", "--gpu-memory-mb", "0"],
        2,
        "fit --gpu-memory-mb 0: give more than 0 and at most 1048576 MB, or -1 for a whole GPU",
    ),
    (["fit", "--gpu-memory-mb", "1", "--replicas", "0"], 2, "fit --replicas 0: give 1 to 100000 replicas"),
    (["usage", "--headroom", "nan"], 2, "usage --headroom nan: not a finite number: give 0 to 1000 percent"),
    # before: accepted, refused only after the GCS was found
    (["head", "--max-pending", "0"], 2, "head --max-pending 0: give 1 to 1000000 connections"),
    # before: "give one of --gpu-memory-mb MB or --shape JSON" (meaning "not both")
    (
        ["fit", "--gpu-memory-mb", "1", "--shape", '{"GPU": 1}'],
        2,
        "give --gpu-memory-mb MB or --shape JSON, not both",
    ),
    # before: "No such option: --verbose" (it worked only before the command); now it is
    # taken and the command goes on to its next error
    (["status", "--verbose", "--timeout", "nan"], 2, f"status --timeout nan: not a finite number: {DAY}"),
    # before: --gcs silently ignored
    (
        ["status", "--head", "127.0.0.1:1", "--gcs", "127.0.0.1:2"],
        2,
        "status --head with --gcs: two sources, give one (--head reads a head agent, --gcs the GCS)",
    ),
    (
        ["fit", "--gcs", "127.0.0.1:2", "--head", "127.0.0.1:1", "--gpu-memory-mb", "1024"],
        2,
        "fit --head with --gcs: two sources, give one (--head reads a head agent, --gcs the GCS)",
    ),
    # before: "rayscope: rayscope status: Invalid value for '--gcs': '127.0.0.1' is not HOST:PORT"
    # (now the port is 6379, as in Ray's own CLI, and nothing listens there)
    (
        ["status", "--gcs", "127.0.0.1:", "--timeout", "1"],
        2,
        "status --gcs: '127.0.0.1:': port must be a number from 1 to 65535",
    ),
    # port 0 is an address to listen on (the OS picks), never one to connect to
    (
        ["status", "--gcs", "127.0.0.1:0"],
        2,
        "status --gcs: '127.0.0.1:0': port must be a number from 1 to 65535",
    ),
    (
        ["head", "--listen", "127.0.0.1:65536"],
        2,
        "head --listen: '127.0.0.1:65536': port must be a number from 1 to 65535, or 0 for any free port",
    ),
    # before: text written into the .json file
    (
        ["status", "--format", "text", "--output", "x.json", "--gcs", "127.0.0.1:1"],
        2,
        "--output x.json names a .json file, but the format asked for is text:"
        " drop --format text or name another file",
    ),
    (
        ["status", "--json", "--output", "x.prom", "--gcs", "127.0.0.1:1"],
        2,
        "--output x.prom names a .prom file, but the format asked for is json:"
        " drop --json or name another file",
    ),
    # click's own errors, one line each (before: "rayscope: rayscope status: No such option: --bogus ...")
    (["status", "--bogus"], 2, "status: no such option --bogus (did you mean --gpus or --gcs?)"),
    (["push"], 2, "push: --head is required"),
    (["fit", "--replicas"], 2, "fit --replicas: needs a value"),
    (["status", "--format", "xml"], 2, "status --format: 'xml' is not one of 'text', 'json', 'prom'"),
    (["bogus"], 2, "'bogus' is not a command: fit, head, node, push, status, usage"),
    # --- the first hour ---
    # before: "'statuss'. Did you mean 'status'? is not a command: fit, ..." (typer's words inside)
    (
        ["statuss"],
        2,
        "'statuss' is not a command (did you mean status?): fit, head, node, push, status, usage",
    ),
    # before: "fit --gpu-memory-mb: '4GB' is not a valid integer" (click's words: no unit, no range)
    (
        ["fit", "--gpu-memory-mb", "4GB"],
        2,
        f"fit --gpu-memory-mb 4GB: the number alone, in MB: {GPU_MB}",
    ),
    # before: "fit --gpu-memory-mb: '0.5' is not a valid integer"
    (["fit", "--gpu-memory-mb", "0.5"], 2, f"fit --gpu-memory-mb 0.5: not a whole number: {GPU_MB}"),
    # before: "fit --gpu-memory-mb: '1e12' is not a valid integer"
    (["fit", "--gpu-memory-mb", "1e12"], 2, f"fit --gpu-memory-mb 1e12: {GPU_MB}"),
    # before: "status --timeout: '5s' is not a valid float"
    (["status", "--timeout", "5s"], 2, f"status --timeout 5s: the number alone, in seconds: {DAY}"),
    # before: "status: Got unexpected extra argument (2s)" (--watch took 2 and left "2s")
    (["status", "--watch", "2s"], 2, f"status --watch 2s: the number alone, in seconds: {DAY}"),
    # before: accepted, then "needs 976562.5 GB" (the range was a pebibyte)
    (["fit", "--gpu-memory-mb", "1", "--memory-mb", "1e9"], 2, "fit --memory-mb 1e9: give 0 to 67108864 MB"),
    # before: "fit --replicas: '1.5' is not a valid integer"
    (
        ["fit", "--gpu-memory-mb", "1", "--replicas", "1.5"],
        2,
        "fit --replicas 1.5: not a whole number: give 1 to 100000 replicas",
    ),
    # before: "head --max-pending: 'many' is not a valid integer"
    (
        ["head", "--max-pending", "many"],
        2,
        "head --max-pending many: not a number: give 1 to 1000000 connections",
    ),
    # before: "usage --headroom: '10%' is not a valid float"
    (
        ["usage", "--headroom", "10%"],
        2,
        "usage --headroom 10%: the number alone, in percent: give 0 to 1000 percent",
    ),
    # before: "status: no such option --address"
    (
        ["status", "--address", "127.0.0.1:6379"],
        2,
        "status: no such option --address (Ray's name: the GCS address is --gcs HOST:PORT here)",
    ),
    # before: "fit: no such option --gcs-address"
    (
        ["fit", "--gcs-address", "127.0.0.1:6379"],
        2,
        "fit: no such option --gcs-address (Ray's name: the GCS address is --gcs HOST:PORT here)",
    ),
    # before: "status --gcs: 'http://127.0.0.1:6379': not a host name or IP address"
    (
        ["status", "--gcs", "http://127.0.0.1:6379"],
        2,
        "status --gcs: 'http://127.0.0.1:6379' is a URL: give HOST:PORT without http:// (127.0.0.1:6379)",
    ),
    # before: "... give HOST:PORT without ray:// (127.0.0.1:10001)": Ray Client's port, no GCS
    (
        ["status", "--gcs", "ray://127.0.0.1:10001"],
        2,
        "status --gcs: 'ray://127.0.0.1:10001' is a Ray Client address (ray.init's ray://; its"
        " server listens on 10001 by default), not the GCS: rayscope reads the GCS, usually"
        " 127.0.0.1:6379",
    ),
    # before: "push --head: 'http://10.0.0.1': port must be a number from 1 to 65535"
    (
        ["push", "--head", "http://10.0.0.1"],
        2,
        "push --head: 'http://10.0.0.1' is a URL: give HOST:PORT without http:// (10.0.0.1)",
    ),
    # before: the token file ignored without a word ("GCS unreachable at 127.0.0.1:1 ...")
    (["status", "--gcs", "127.0.0.1:1", "--token-file", "token"], 2, f"status {UNUSED_TOKEN}"),
    (
        ["fit", "--token-file", "token", "--gcs", "127.0.0.1:1", "--gpu-memory-mb", "1024"],
        2,
        f"fit {UNUSED_TOKEN}",
    ),
    (["--verbose"], 2, "give a command: fit, head, node, push, status, usage (rayscope --help)"),
]


@pytest.mark.parametrize(("argv", "code", "line"), USAGE, ids=[" ".join(c[0]) for c in USAGE])
def test_a_mistake_is_one_line_and_its_exit_code(
    argv: list[str], code: int, line: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rayscope", *argv],
        cwd=tmp_path,
        env={**base_env(RAY_AUTH_MODE="disabled"), "PYTHONPATH": f"{REPO / 'agent'}:{REPO}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (one_line(done), done.returncode) == (line, code)


def test_gcs_host_without_a_port_means_6379_as_in_rays_cli() -> None:
    """Before: ``'10.0.0.1' is not HOST:PORT`` (while ``push --head HOST`` took a default)."""
    done = run_rayscope("status", "--gcs", "127.0.0.1", "--timeout", "2")
    assert one_line(done) in (
        "GCS unreachable at 127.0.0.1:6379 (connection refused)",
        "GCS unreachable at 127.0.0.1:6379 (timeout 2 s)",
    )


def test_ray_address_is_the_gcs_as_ray_reads_it() -> None:
    """``RAY_ADDRESS`` names the GCS (Ray's own variable, read by ``ray.init()``). Before:
    ignored, the local raylet's cluster (or ``no GCS address``) read instead."""
    port = refused_port()
    done = run_rayscope(
        "status", "--timeout", "2", env=base_env(RAY_AUTH_MODE="disabled", RAY_ADDRESS=f"127.0.0.1:{port}")
    )
    assert done.returncode == 2 and f"127.0.0.1:{port}" in one_line(done), done.stderr
    done = run_rayscope("node", "--json", env=base_env(RAY_ADDRESS="ray://127.0.0.1:10001"))
    assert "is a Ray Client address" in done.stdout, done.stdout


def test_the_verbose_flag_after_the_command_is_the_global_one() -> None:
    done = run_rayscope("status", "--gcs", f"127.0.0.1:{refused_port()}", "-v")
    assert done.returncode == 2 and "Traceback" in done.stderr  # --verbose's traceback
    assert done.stderr.splitlines()[-1].startswith("rayscope: GCS unreachable at")


def test_the_hint_follows_only_on_a_terminal() -> None:
    """On a terminal a second line says where the options are; never a box."""
    import pty

    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "rayscope", "status", "--timeout", "nan"],
            cwd=REPO,
            env=base_env(RAY_AUTH_MODE="disabled"),
            stdout=subprocess.DEVNULL,
            stderr=follower,
        )
        assert process.wait(timeout=60) == 2
        os.close(follower)
        said = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            said += chunk
    finally:
        os.close(leader)
    assert said.decode().splitlines() == [
        f"rayscope: status --timeout nan: not a finite number: {DAY}",
        "  (rayscope status --help lists the options)",
    ]


# --- files and peers --------------------------------------------------------------------


def test_a_directory_as_token_file_is_named_a_directory(tmp_path: Path) -> None:
    """Before: ``token file D is open to group or others (mode 755): chmod 600 D``."""
    done = run_rayscope("status", "--head", f"127.0.0.1:{refused_port()}", "--token-file", str(tmp_path))
    assert (one_line(done), done.returncode) == (
        f"token file {tmp_path} is a directory: name the file in it that holds the token"
        f" (e.g. {tmp_path}/token)",
        2,
    )


def test_a_fifo_as_token_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Before: the read blocked until someone wrote into the FIFO (for ever, from cron)."""
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    closed = f"127.0.0.1:{refused_port()}"
    done = run_rayscope("status", "--head", closed, "--token-file", str(fifo), timeout=30)
    assert (one_line(done), done.returncode) == (
        f"token file {fifo} is not a regular file: name the file that holds the token",
        2,
    )


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.fixture
def speaks_http2_first() -> Iterator[int]:
    """A port that behaves as Ray's GCS was seen to: its SETTINGS frame on accept, and the
    connection closed on the first bytes that are not HTTP/2's preface (an HTTP/1.1 request);
    silence is waited on."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.sendall(RAY_GCS_SETTINGS)
            conn.settimeout(30)
            try:
                data = conn.recv(64)
            except OSError:
                return
            while data and HTTP2_PREFACE.startswith(data[: len(HTTP2_PREFACE)]) and not stop.is_set():
                data = conn.recv(64)

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        fake_server.wake(server)
        thread.join(timeout=5)
        server.close()


def test_status_head_at_the_report_port_names_it_and_shows_no_byte_of_it(
    head_daemon: Any, wire_token: Path
) -> None:
    """Before: ``head agent unreachable at http://...:7531 (rsc\\xc2\\xa9.\\xc3...)``: the
    head's random challenge on the operator's terminal."""
    url = f"http://127.0.0.1:{head_daemon.listen_port}"
    done = run_rayscope("status", "--head", url, "--token-file", str(wire_token))
    assert (one_line(done), done.returncode) == (
        f"{url} is a rayscope head's report port (node agents push to it; 7531 by default), not its HTTP"
        " port: status --head wants the head's --http address (7532 by default)",
        2,
    )


def test_status_head_at_a_gcs_says_grpc(speaks_http2_first: int) -> None:
    """Before: ``head agent unreachable at http://...:6379 (@@@\\xc3>?)``."""
    url = f"http://127.0.0.1:{speaks_http2_first}"
    done = run_rayscope("status", "--head", url)
    assert (one_line(done), done.returncode) == (
        f"{url} is a gRPC port (Ray's GCS listens on 6379 by default), not a head agent: status --head"
        " wants the head's --http address (7532 by default)",
        2,
    )


def test_a_missing_token_and_a_wrong_token_are_told_apart(head_daemon: Any, tmp_path: Path) -> None:
    """Before: both ``requires its token: pass --token-file``, even with one passed."""
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token-0123456789\n")
    wrong.chmod(0o600)
    missing = run_rayscope("status", "--head", head_daemon.url)
    assert (one_line(missing), missing.returncode) == (
        f"head agent at {head_daemon.url} requires a token: pass --token-file (the head's)",
        2,
    )
    refused = run_rayscope("status", "--head", head_daemon.url, "--token-file", str(wrong))
    assert (one_line(refused), refused.returncode) == (
        f"head agent at {head_daemon.url} refused the token from {wrong}: it holds another one"
        " (its --token-file or --read-token-file)",
        2,
    )


@pytest.mark.parametrize("port", ["listen_port", "http_port"])
def test_gcs_at_a_heads_port_is_no_gcs_and_says_what_it_is(head_daemon: Any, port: str) -> None:
    """Before: ``GCS unreachable at 127.0.0.1:7531 (timeout 5 s)``: the port answered."""
    address = f"127.0.0.1:{getattr(head_daemon, port)}"
    done = run_rayscope("status", "--gcs", address, "--timeout", "3")
    what = {
        "listen_port": "a rayscope head's report port (node agents push to it; 7531 by default)",
        "http_port": "a rayscope head's HTTP port (status, metrics; 7532 by default)"
        f" (read it with status --head http://{address})",
    }[port]
    assert (one_line(done), done.returncode) == (
        f"no GCS at {address}: it is {what}; Ray's GCS listens on 6379 by default",
        2,
    )


def a_node_id_here() -> str:
    """A node id ``push --node-id`` takes on this host: a raylet's that runs here (another
    test's cluster), else one of its own (no raylet: a host-only agent)."""
    from rayscope.sources import raylet

    raylets, _ = raylet.find_raylets()
    return raylets[0].node_id if raylets else "f" * 56


def push_warning(head: str, *extra: str, timeout_s: float = 30.0) -> str:
    """The first warning ``rayscope push --head HEAD`` logs (then SIGTERM): its message."""
    process = subprocess.Popen(
        [sys.executable, "-m", "rayscope", *push_once_a_second(head, a_node_id_here(), *extra)],
        cwd=REPO,
        env=base_env(RAY_AUTH_MODE="disabled"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    deadline = time.monotonic() + timeout_s
    try:
        for line in process.stderr:
            if " WARNING " in line:
                return line.split(" WARNING ", 1)[1].rstrip("\n")
            assert time.monotonic() < deadline, "no warning"
        raise AssertionError(f"push exited {process.wait()} without a warning")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
        process.stderr.close()


def test_push_at_the_http_port_names_it(head_daemon: Any, wire_token: Path) -> None:
    """Before: ``head 127.0.0.1:7532 unreachable: timed out (retrying with backoff)``."""
    head = f"127.0.0.1:{head_daemon.http_port}"
    assert push_warning(head, "--token-file", str(wire_token)) == (
        f"head {head} is a rayscope head's HTTP port (status, metrics; 7532 by default), not a head's"
        " report port: push --head wants the head's --listen address (7531 by default)"
        " (retrying with backoff)"
    )


def test_push_at_a_gcs_names_it(speaks_http2_first: int) -> None:
    """Before: ``unreachable: the peer did not greet as a rayscope head (version 2)``."""
    head = f"127.0.0.1:{speaks_http2_first}"
    assert push_warning(head) == (
        f"head {head} is a gRPC port (Ray's GCS listens on 6379 by default), not a head's report port:"
        " push --head wants the head's --listen address (7531 by default) (retrying with backoff)"
    )


def test_push_without_a_token_to_a_head_that_has_one(head_daemon: Any) -> None:
    """Before: ``token rejected (bad token): the head holds a different token; check --token-file``."""
    head = f"127.0.0.1:{head_daemon.listen_port}"
    assert push_warning(head) == (
        f"head {head} rejected the report: the head requires a token and this agent has none: pass"
        " --token-file (the head's file) (retrying with backoff)"
    )


def test_a_rejection_word_the_agent_does_not_know_is_logged_printable() -> None:
    """The head's rejection reason is the peer's text: before, a head could put an escape
    sequence into the agent's log (and its operator's terminal)."""
    from rayscope.net import wire

    assert wire.rejection_text(wire.BAD_TOKEN).startswith("token rejected (bad token)")
    assert wire.rejection_text("\x1b[2Jcleared\x1b]0;t\x07") == "[2Jcleared]0;t"


def test_push_refuses_a_host_with_two_clusters_raylets_as_status_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: ``push`` reported for the first raylet found, of whichever cluster (seen here:
    a different cluster's raylet on each start), where ``status`` refuses to guess."""
    from rayscope.errors import AgentError
    from rayscope.net.tls import NO_TLS
    from rayscope.node import push
    from rayscope.schema.report import RayletInfo, SourceStatus
    from rayscope.sources import raylet

    two = [
        RayletInfo(pid=10, node_id="a" * 56, node_ip="10.0.0.1", gcs_address="10.0.0.1:6379"),
        RayletInfo(pid=11, node_id="b" * 56, node_ip="10.0.0.1", gcs_address="10.0.0.9:6379"),
    ]
    monkeypatch.setattr(raylet, "find_raylets", lambda: (two, SourceStatus(name="raylet", ok=True)))
    with pytest.raises(AgentError) as refused:
        push.run("127.0.0.1:7531", None, 5.0, None, NO_TLS)
    assert (str(refused.value), refused.value.exit_code) == (
        "raylets of 2 clusters run on this host (10.0.0.1:6379, 10.0.0.9:6379): pass --node-id of the node"
        " to report for (`rayscope node` lists them)",
        2,
    )
    same_cluster = [two[0], msgspec_replace(two[1], gcs_address="10.0.0.1:6379")]
    assert raylet.clusters_here(same_cluster) == ""  # several raylets of one cluster: not ambiguous


def msgspec_replace(info: Any, **changes: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(info, **changes)


# --- a new operator's first hour, second round ----------------------------------


def test_https_against_a_plain_http_head_says_it_serves_plain_http(head_daemon: Any) -> None:
    """Before: ``head agent unreachable at https://127.0.0.1:PORT ([ssl:
    unexpected_eof_while_reading] eof occurred in violation of protocol (_ssl.c:1006))``."""
    url = f"https://127.0.0.1:{head_daemon.http_port}"
    done = run_rayscope("status", "--head", url, "--timeout", "5")
    assert (one_line(done), done.returncode) == (
        f"{url}: the head there serves plain HTTP, not TLS: use http://127.0.0.1:{head_daemon.http_port}"
        " without --tls-* (or start the head with --tls-cert and --tls-key)",
        2,
    )


def test_push_refuses_a_node_id_no_raylet_here_has(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: one INFO line ("reporting it without one"), then a phantom node reported for
    good (``vm [worker] VRAM: NA/NA GB  agent: manual, no raylet``) while ``status`` exited 0.
    A host without raylets keeps its host-only agent, whatever id it is given."""
    from rayscope.errors import AgentError
    from rayscope.net.tls import NO_TLS
    from rayscope.node import push
    from rayscope.schema.report import RayletInfo, SourceStatus
    from rayscope.sources import raylet

    here = [
        RayletInfo(pid=10, node_id="a" * 56, node_ip="10.0.0.1", gcs_address="10.0.0.1:6379"),
        RayletInfo(pid=11, node_id="ab" + "c" * 54, node_ip="10.0.0.1", gcs_address="10.0.0.1:6379"),
    ]
    monkeypatch.setattr(raylet, "find_raylets", lambda: (here, SourceStatus(name="raylet", ok=True)))
    with pytest.raises(AgentError) as refused:
        push.run("127.0.0.1:7531", None, 5.0, "deadbeef", NO_TLS)
    assert (str(refused.value), refused.value.exit_code) == (
        "--node-id deadbeef: no raylet on this host has that id (here: aaaaaaaaaaaa (pid 10),"
        " abcccccccccc (pid 11); a prefix is enough): pass one of them, or leave --node-id out"
        " (`rayscope node` lists them)",
        2,
    )
    with pytest.raises(AgentError) as several:
        push.run("127.0.0.1:7531", None, 5.0, "a", NO_TLS)
    assert str(several.value) == (
        "--node-id a: 2 raylets on this host have ids that start with it (aaaaaaaaaaaa (pid 10),"
        " abcccccccccc (pid 11)): give more of the id"
    )
    assert raylet.node_id_mistake(here, "ab") == ""  # a prefix one raylet has
    assert raylet.node_id_mistake([], "deadbeef") == ""  # a host-only agent: its id is the operator's
    # A whole id no raylet here has was copied on purpose (a node whose raylet runs elsewhere;
    # the live tests' simulated nodes): taken, and the agent logs that no local raylet has it.
    assert raylet.node_id_mistake(here, "de" * 28) == ""
    assert raylet.node_id_mistake(here, "de" * 27) != ""  # one byte short: a typo again


def test_a_second_head_on_a_busy_port_says_who_may_hold_it(head_daemon: Any, wire_token: Path) -> None:
    """Before: ``head agent cannot start: error while attempting to bind on address
    ('127.0.0.1', 7531): address already in use``."""
    busy = {"--listen": head_daemon.listen_port, "--http": head_daemon.http_port}
    for option, port in busy.items():
        ports = {"--listen": 0, "--http": 0, option: port}  # the other one: the OS's
        done = run_rayscope(
            "head",
            *(word for name, given in ports.items() for word in (name, f"127.0.0.1:{given}")),
            "--gcs",
            f"127.0.0.1:{refused_port()}",
            "--token-file",
            str(wire_token),
            timeout=60,
        )
        assert (one_line(done), done.returncode) == (
            f"{option} 127.0.0.1:{port} is in use: a rayscope head (or another program) already listens"
            f" there (`ss -ltnp 'sport = :{port}'` names it): stop it, or give {option} another port",
            1,
        )


def test_fit_for_a_whole_gpu_says_it_once() -> None:
    """Before: ``Shape: {"GPU": 1} per replica (a whole GPU: -1 asks for a whole GPU
    (VRAM_MB packing ignored))``."""
    from rayscope.core.capacity.sizing import request_sizing
    from rayscope.schema.fit import FitRequest
    from rayscope.schema.status import ClusterStatus, ClusterTotals

    empty = ClusterStatus(generated_at=0.0, view="gcs", cluster=ClusterTotals())
    sizing = request_sizing(empty, FitRequest(gpu_memory_mb=-1))
    assert (sizing.name, sizing.why, sizing.shape) == (
        "whole_gpu",
        "--gpu-memory-mb -1, no VRAM_MB booked",
        {"GPU": 1.0},
    )


@pytest.mark.parametrize(("mb", "warned"), [(4, True), (63, True), (64, False), (4096, False), (-1, False)])
def test_a_gpu_memory_that_reads_like_gb_is_taken_with_a_warning(mb: int, warned: bool) -> None:
    """``--gpu-memory-mb 4`` is 4 MB, as given, and said so with what 4 GB would be; sizes
    from 64 MB on (and -1, a whole GPU) say nothing. The cluster is unreachable: the warning
    comes before the read, and the exit code is the read's (2), not the warning's."""
    closed = f"127.0.0.1:{refused_port()}"
    done = run_rayscope("fit", "--gpu-memory-mb", str(mb), "--gcs", closed, "--timeout", "2")
    assert done.returncode == 2, done.stderr
    warning = f"rayscope: warning: --gpu-memory-mb {mb} is {mb} MB, as given; the option is in MB"
    assert (warning in done.stderr) == warned, done.stderr
    if warned:
        assert f"(for {mb} GB give --gpu-memory-mb {mb * 1024})" in done.stderr
        assert done.stderr.count("\n") == 2, done.stderr  # the warning, then the read's one line
