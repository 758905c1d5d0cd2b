"""Ray's token goes only to a listener that is the dashboard (SECURITY.md, *Ray's dashboard*).

The GCS keeps the dashboard's published address after the dashboard is gone, so whoever
listens on that port next is asked with root's ``Authorization: Bearer <Ray token>``. These
tests run as root and play the squatter with a socket created under uid 65534 (``nobody``):
before the fix, a published address on the GCS's host was enough, and the squatter received
the token from ``status`` (and from the head on every poll). Now the token goes to a
published address only when the socket listening there on this host is root's or this
user's (``trust.listener_refusal``, from ``/proc/net/tcp``: ``rayscope.sources.listeners``),
and to any address the operator named.

Positive control: make ``dashboard.token_withheld`` answer ``""`` for a published address and
:func:`test_status_sends_no_token_to_a_squatter_on_the_published_port` fails: the squatter's
requests carry the token.
"""

import contextlib
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from rayscope.cli import app as cli
from rayscope.head.poll import dashboard as head_dashboard
from rayscope.head.store.state import HeadState
from rayscope.net.deadline import Deadline
from rayscope.schema.dashboard import DashboardRead
from rayscope.sources import dashboard, listeners
from rayscope.sources.dashboard.parallel import ParallelRead
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import prestart as gcs_prestart
from rayscope.sources.gcs import read as gcs_read
from tests.support.dashboard import NODE_ID, FakeDashboard, answer, http, node
from tests.support.ports import refused_port

pytestmark = [
    pytest.mark.usefixtures("no_child_left"),
    pytest.mark.skipif(os.geteuid() != 0, reason="plays another user: needs root"),
]

NOBODY = 65534
TOKEN = "s3cret-ray-token"
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
SEED = json.loads((Path(__file__).resolve().parent / "data" / "gcs_seed_nodes.json").read_text())["nodes"]


def listener_as(uid: int, host: str = "127.0.0.1") -> socket.socket:
    """A listening socket created under effective uid ``uid``: ``/proc/net/tcp`` names it
    that uid's, as it would a socket another user's process opened."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    os.seteuid(uid)
    try:
        return socket.create_server((host, 0), family=family)
    finally:
        os.seteuid(0)


def rays_rule(conn: socket.socket, request: bytes) -> None:
    """Ray 2.52+ under token auth: 401 without the token, 200 with it."""
    if f"\r\nAuthorization: Bearer {TOKEN}\r\n".encode() in request:
        conn.sendall(http(200, answer(node(SEED[0]["node_id"]))))
    else:
        conn.sendall(http(401, b"Unauthorized: Missing authentication token"))


def made_up(conn: socket.socket, _request: bytes) -> None:
    """A squatter that asks for nothing and answers figures of its own."""
    conn.sendall(http(200, answer(node(NODE_ID))))


@contextlib.contextmanager
def dashboard_as(
    uid: int, serve: Callable[[socket.socket, bytes], None] = rays_rule, host: str = "127.0.0.1"
) -> Iterator[FakeDashboard]:
    server = FakeDashboard(serve, listener=listener_as(uid, host))
    try:
        yield server
    finally:
        server.close()


def got_token(server: FakeDashboard) -> bool:
    return any(TOKEN.encode() in request for request in server.requests)


def host_port(url: str) -> str:
    return url.removeprefix("http://")


# --- the rule ------------------------------------------------------------------------------


def test_the_listeners_owner_is_read_from_proc() -> None:
    """The parsing against the kernel's own table: a socket of uid 65534 and one of root."""
    for uid, host in ((NOBODY, "127.0.0.1"), (0, "127.0.0.1"), (NOBODY, "::1")):
        with contextlib.closing(listener_as(uid, host)) as sock:
            port = sock.getsockname()[1]
            found = listeners.owners(listeners.addresses_of(host) or [], port)
            assert found == listeners.Owners(frozenset({uid}), ""), (uid, host, found)


def test_a_published_dashboard_held_by_another_user_gets_no_token() -> None:
    with contextlib.closing(listener_as(NOBODY)) as sock:
        port = sock.getsockname()[1]
        why = dashboard.token_withheld(dashboard.Address(f"http://127.0.0.1:{port}", "GCS"))
    assert why == f"port {port} on 127.0.0.1 is listened on by uid {NOBODY}, not by root or uid 0"


def test_a_published_dashboard_of_root_gets_the_token() -> None:
    with contextlib.closing(listener_as(0)) as sock:
        assert (
            dashboard.token_withheld(dashboard.Address(f"http://127.0.0.1:{sock.getsockname()[1]}", "GCS"))
            == ""
        )


def test_an_address_the_operator_named_gets_the_token_whoever_listens() -> None:
    with contextlib.closing(listener_as(NOBODY)) as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        for origin in ("--dashboard", f"${dashboard.DASHBOARD_ENV}"):
            assert dashboard.token_withheld(dashboard.Address(url, origin)) == ""


def test_a_published_address_nobody_listens_on_or_of_another_host_gets_no_token() -> None:
    free = refused_port()
    assert dashboard.token_withheld(dashboard.Address(f"http://127.0.0.1:{free}", "GCS")) == (
        f"nothing listens on port {free} on 127.0.0.1 here"
    )
    elsewhere = "203.0.113.7"  # TEST-NET-3: no host's
    assert not listeners.is_here(ipaddress.ip_address(elsewhere))
    assert dashboard.token_withheld(dashboard.Address(f"http://{elsewhere}:8265", "GCS")) == (
        f"{elsewhere} is not an address of this host: who listens there cannot be checked"
    )
    assert dashboard.token_withheld(dashboard.Address("http://ray-head:8265", "GCS")) == (
        "ray-head is a host name, not an address of this host: who listens there cannot be checked"
    )


# --- the CLI: status, and fit, through the parallel read -----------------------------------


def fake_gcs_child(published: str) -> Callable[..., dict[str, Any]]:
    """The GCS child's answer: the dashboard's address first (its early stderr line), then
    the recorded seed nodes."""

    def child_answer(
        _address: str,
        _timeout_s: float,
        _python: str,
        _left: float,
        _extra: Any,
        _naming: Any = None,
        on_line: Optional[Callable[[str], None]] = None,
    ) -> dict[str, Any]:
        if on_line is not None:
            on_line(gcs_read.DASHBOARD_MARK + json.dumps(published))
        return {
            "ok": True,
            "nodes": SEED,
            "dashboard_url": published,
            "dashboard_url_error": "",
            "ray_version": "2.60.0",
            "cluster_ray_version": "2.60.0",
            "cluster_ray_version_error": "",
        }

    return child_answer


def run_status(
    published: str,
    fake_gcs: str,
    words: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, str, str]:
    """``rayscope status --gcs FAKE [words]`` in this process, the GCS child's answer
    naming ``published`` as the dashboard, Ray's token in the environment."""
    for name, value in AUTH.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(dashboard.DASHBOARD_ENV, raising=False)
    monkeypatch.setattr(gcs_prestart, "start", lambda *_a, **_k: None)
    monkeypatch.setattr(gcs_child, "_child_answer", fake_gcs_child(published))
    with pytest.raises(SystemExit) as done:
        cli.main(["status", "--gcs", fake_gcs, "--timeout", "5", *words])
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def test_status_sends_no_token_to_a_squatter_on_the_published_port(
    fake_gcs: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exploit: the GCS still names the dashboard's port, uid 65534 listens there and
    asks for a token. Before: it received root's. Now: withheld, and one line says why and
    what to pass."""
    with dashboard_as(NOBODY) as squatter:
        code, out, err = run_status(host_port(squatter.url), fake_gcs, [], capsys, monkeypatch)
    assert squatter.requests, "the dashboard was not read at all"
    assert not got_token(squatter), "the squatter received Ray's token"
    said = [line for line in (out + err).splitlines() if "withheld" in line]
    assert len(said) == 1, out + err
    assert f"listened on by uid {NOBODY}" in said[0] and f"--dashboard {squatter.url}" in said[0]
    assert code == 0, err


def test_status_sends_the_token_to_roots_dashboard_on_the_published_port(
    fake_gcs: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with dashboard_as(0) as server:
        code, out, err = run_status(host_port(server.url), fake_gcs, [], capsys, monkeypatch)
    assert got_token(server) and code == 0, out + err
    assert "withheld" not in out + err


def test_status_sends_the_token_where_the_operator_named_even_to_another_user(
    fake_gcs: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with dashboard_as(NOBODY) as named:
        code, out, err = run_status("127.0.0.1:9", fake_gcs, ["--dashboard", named.url], capsys, monkeypatch)
    assert got_token(named) and code == 0, out + err


def test_a_squatter_that_asks_nothing_is_read_without_the_token_and_says_so() -> None:
    """A listener that answers without auth is still read (a dashboard without token auth
    is), but without the token, and ``--verbose`` says the token was withheld and why."""
    with dashboard_as(NOBODY, made_up) as squatter:
        early = ParallelRead(None, Deadline(5.0), AUTH)
        early.on_published(host_port(squatter.url))
        read = early.result("2.60.0", None, "")
    assert not got_token(squatter)
    assert read is not None and read.status.ok
    assert (
        f"Ray's token withheld: port {squatter.url.rpartition(':')[2]} on 127.0.0.1 is listened on by uid"
        in (read.status.detail)
    )


# --- the head: every poll --------------------------------------------------------------------


class FakeReader:
    """What ``poll_dashboard`` asks of the head's GCS reader."""

    def __init__(self, published: str) -> None:
        self.published = published
        self.address = f"{published.rpartition(':')[0]}:6379"  # the GCS on the dashboard's host
        self.timeout_s = 5.0
        self.cluster_ray_version: Optional[str] = "2.60.0"

    def dashboard_url(self) -> tuple[Optional[str], str]:
        return self.published, ""


class Polled(HeadState):
    """A head whose every round needs the dashboard, and that keeps each read it is given."""

    def __init__(self) -> None:
        super().__init__(5.0, "127.0.0.1:6379")
        self.reads: list[Optional[DashboardRead]] = []

    def needs_dashboard(self, now: float) -> bool:
        return True

    def set_dashboard(self, read: Optional[DashboardRead]) -> None:
        self.reads.append(read)


def head_poll(published: str, option: Optional[str] = None) -> DashboardRead:
    """One round of the head's dashboard poll, the GCS naming ``published``."""
    state = Polled()
    reader: Any = FakeReader(published)
    head_dashboard.poll_dashboard(state, reader, head_dashboard.DashboardSetting(option, AUTH))
    read = state.reads[-1]
    assert read is not None
    return read


def test_the_heads_poll_sends_no_token_to_a_squatter() -> None:
    with dashboard_as(NOBODY) as squatter:
        for _ in range(2):  # every round
            read = head_poll(host_port(squatter.url))
    assert len(squatter.requests) == 2 and not got_token(squatter)
    assert not read.status.ok and "withheld" in read.status.reason and "\n" not in read.status.reason
    assert f"--dashboard {squatter.url}" in read.status.reason


def test_the_heads_poll_sends_the_token_to_root_or_where_named() -> None:
    with dashboard_as(0) as server:
        read = head_poll(host_port(server.url))
    assert got_token(server) and read.status.ok and set(read.nodes) == {SEED[0]["node_id"]}
    with dashboard_as(NOBODY) as named:
        read = head_poll("127.0.0.1:9", named.url)
    assert got_token(named) and read.status.ok


def test_a_squatter_on_ipv6_loopback_gets_no_token() -> None:
    with dashboard_as(NOBODY, host="::1") as squatter:
        read = head_poll(host_port(squatter.url))
    assert squatter.requests and not got_token(squatter), read


# --- the API -------------------------------------------------------------------------------


def test_the_api_sends_no_token_to_a_squatter(fake_gcs: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import rayscope

    for name, value in AUTH.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(dashboard.DASHBOARD_ENV, raising=False)
    with dashboard_as(NOBODY) as squatter:
        monkeypatch.setattr(gcs_child, "_child_answer", fake_gcs_child(host_port(squatter.url)))
        state = rayscope.cluster_state(gcs=fake_gcs, timeout=5)
    assert squatter.requests and not got_token(squatter)
    said = [s for s in state["sources"] if s["name"] == "dashboard"]
    assert said and not said[0]["ok"] and "withheld" in said[0]["reason"], said


# --- the tables, as the kernel writes them --------------------------------------------------


def hex_address(ip: str) -> str:
    """An address as ``/proc/net/tcp*`` write it: each 32-bit word in the host's byte order."""
    raw = ipaddress.ip_address(ip).packed
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return raw.hex().upper()


def row(number: int, ip: str, port: int, state: str, uid: int) -> str:
    remote = "0" * (8 if "." in ip else 32)
    return (
        f"{number:4d}: {hex_address(ip)}:{port:04X} {remote}:0000 {state} 00000000:00000000"
        f" 00:00000000 00000000 {uid:5d}        0 {1000 + number} 1 0000000000000000 100 0 0 10 0\n"
    )


HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def tables(tmp_path: Path, tcp: list[str], tcp6: Optional[list[str]] = None) -> str:
    (tmp_path / "tcp").write_text(HEADER + "".join(tcp))
    if tcp6 is not None:
        (tmp_path / "tcp6").write_text(HEADER + "".join(tcp6))
    return str(tmp_path)


def v4(text: str) -> list[listeners.IpAddress]:
    return listeners.addresses_of(text) or []


def test_only_listen_rows_on_the_port_that_reach_the_address_count(tmp_path: Path) -> None:
    proc = tables(
        tmp_path,
        [
            row(0, "127.0.0.1", 8265, "0A", 0),
            row(1, "127.0.0.1", 8266, "0A", 1001),  # another port
            row(2, "127.0.0.1", 8265, "01", 1002),  # an established connection, not a listener
            row(3, "10.1.2.3", 8265, "0A", 1003),  # another address of this host
        ],
        [row(0, "::ffff:127.0.0.1", 8265, "0A", 1004), row(1, "::1", 8265, "0A", 1005)],
    )
    assert listeners.owners(v4("127.0.0.1"), 8265, proc) == listeners.Owners(frozenset({0, 1004}))
    assert listeners.owners(v4("::1"), 8265, proc) == listeners.Owners(frozenset({1005}))
    assert listeners.owners(v4("10.1.2.3"), 8265, proc) == listeners.Owners(frozenset({1003}))
    assert listeners.owners(v4("127.0.0.1"), 9999, proc) == listeners.Owners()


def test_a_wildcard_listener_reaches_every_address(tmp_path: Path) -> None:
    proc = tables(tmp_path, [row(0, "0.0.0.0", 8265, "0A", 1001)], [row(0, "::", 8265, "0A", 1002)])
    assert listeners.owners(v4("10.1.2.3"), 8265, proc).uids == {1001, 1002}  # :: may take IPv4 too
    assert listeners.owners(v4("fe80::1"), 8265, proc).uids == {1002}


def test_a_table_that_cannot_be_read_or_is_not_the_kernels_is_an_owner_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert listeners.owners(v4("127.0.0.1"), 8265, str(tmp_path / "gone")).error.endswith("tcp is not there")
    garbage = tables(tmp_path, ["   0: 0100007F:ZZZZ 00000000:0000 0A 0 0 0 0\n"])
    assert "is not the kernel's table" in listeners.owners(v4("127.0.0.1"), 8265, garbage).error
    (tmp_path / "tcp").write_bytes(HEADER.encode() + b"x" * 4096 + b"\n")
    assert "larger than rayscope reads" in listeners.owners(v4("127.0.0.1"), 8265, garbage).error
    monkeypatch.setattr(listeners, "MAX_TABLE_BYTES", 2 * len(HEADER))
    tables(tmp_path, [row(n, "127.0.0.1", 1000 + n, "0A", 0) for n in range(10)])
    assert "larger than rayscope reads" in listeners.owners(v4("127.0.0.1"), 8265, garbage).error
    (tmp_path / "tcp").unlink()
    (tmp_path / "tcp").mkdir()  # read as root, a mode would not stop it: a directory does
    assert "tcp could not be read (Is a directory)" in listeners.owners(v4("127.0.0.1"), 8265, garbage).error


def test_an_owner_unknown_withholds_the_token(tmp_path: Path) -> None:
    address = dashboard.Address("http://127.0.0.1:8265", "GCS")
    why = dashboard.token_withheld(address, proc_net=str(tmp_path / "gone"))
    assert why.startswith("who listens on port 8265 on 127.0.0.1 is unknown: ") and "tcp is not there" in why


def test_the_user_rayscope_runs_as_is_trusted_like_root() -> None:
    """As for raylets: a dashboard of the user running rayscope (Ray's user, ``User=ray``)
    gets the token; another user's does not."""
    with contextlib.closing(listener_as(NOBODY)) as sock:
        address = dashboard.Address(f"http://127.0.0.1:{sock.getsockname()[1]}", "GCS")
        assert dashboard.token_withheld(address, me=NOBODY) == ""
        assert "uid 65534, not by root or uid 1000" in dashboard.token_withheld(address, me=1000)


def interface_address() -> str:
    """One of this host's addresses that is not loopback (Ray publishes the node's IP)."""
    import psutil

    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family == socket.AF_INET and not entry.address.startswith("127."):
                return str(entry.address)
    pytest.skip("this host has no IPv4 address but loopback")


def test_a_wildcard_listener_on_an_address_of_this_host_is_checked(tmp_path: Path) -> None:
    """The published address is the node's IP; whoever listens on every address holds it
    (the kernel's tables, written here: the tests bind loopback only)."""
    here = interface_address()
    address = dashboard.Address(f"http://{here}:8265", "GCS")
    squatted = tables(tmp_path, [row(0, "0.0.0.0", 8265, "0A", NOBODY)])
    assert dashboard.token_withheld(address, proc_net=squatted) == (
        f"port 8265 on {here} is listened on by uid {NOBODY}, not by root or uid 0"
    )
    roots = tables(tmp_path, [row(0, here, 8265, "0A", 0)], [row(0, "::", 8265, "0A", 0)])
    assert dashboard.token_withheld(address, proc_net=roots) == ""
