"""The report port under attack and under faults, with real ``rayscope head`` and ``push``
processes on loopback (no Ray cluster needed: the head's GCS is a closed port).

* replay: a frame recorded off the wire and resent after the node went stale;
* a wrong token, a head that never reads, a SIGSTOPped head, a cut network (a proxy that
  stops forwarding): the agent says so within 3 intervals and backs off or reconnects;
* 1,100 dripping connections against a head held to 1024 file descriptors;
* TLS: agents and ``status --head`` over TLS, plain clients refused.
"""

import contextlib
import datetime
import json
import resource
import select
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, Optional

import pytest

from rayscope.net import wire
from tests.conftest import Daemon, push_agent, run_rayscope
from tests.reliability_plugin import FaultRecord
from tests.schemas import parsed
from tests.support import fake_server
from tests.support.head import ENV, NODE, Head
from tests.support.pki import make_pki, tls_options
from tests.waiting import eventually

pytestmark = pytest.mark.live


def log_times(text: str, needle: str) -> list[float]:
    """Wall-clock times of the log lines that contain ``needle`` (the daemons' asctime)."""
    out = []
    for line in text.splitlines():
        if needle in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            out.append(stamp.timestamp())
    return out


class Proxy(fake_server.FakeServer):
    """A TCP forwarder between one agent and the head that records what the agent sends
    and can cut the network (stop forwarding both ways, keep the sockets open)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.recordings: list[bytearray] = []
        self.cut = threading.Event()
        super().__init__(self._forward)

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:  # the head is away: the agent sees its connection closed
            return
        with upstream:
            recording = bytearray()
            self.recordings.append(recording)
            back = threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True)
            back.start()
            self._pipe(client, upstream, recording)
            back.join(fake_server.JOIN_TIMEOUT_S)  # it sees the stop within its 0.2 s recv timeout

    def _pipe(self, src: socket.socket, dst: socket.socket, recording: Optional[bytearray]) -> None:
        src.settimeout(0.2)
        while not self.stop.is_set():
            if self.cut.is_set():
                time.sleep(0.05)
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            if recording is not None:
                recording += data
            with contextlib.suppress(OSError):
                dst.sendall(data)


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[int], Proxy]]:
    proxies: list[Proxy] = []

    def make(port: int) -> Proxy:
        proxies.append(Proxy(port))
        return proxies[-1]

    yield make
    for p in proxies:
        p.close()


def test_a_recorded_frame_replayed_after_the_node_went_stale_leaves_it_stale(
    tmp_path: Path, token: Path, proxy_factory: Callable[[int], Proxy]
) -> None:
    """The attacker records a real agent's connection (a proxy) and resends every byte of it
    on a new connection once the agent is gone. Before wire v2 this made the dead node fresh
    again; positive control: drop the challenge from the MACs in ``wire._Keyed``."""
    head = Head(tmp_path / "head.log", token)
    proxy = proxy_factory(head.listen_port)
    agent = push_agent(proxy.port, NODE, ENV, tmp_path / "push.log", token, 1.0)
    try:
        eventually(lambda: head.agent_state() == "reporting", 30, "the agent reports")
        taken = head.health()["reports_received"]
        eventually(lambda: head.health()["reports_received"] >= taken + 2, 10, "more frames on the recording")
        agent.kill()
        eventually(lambda: head.agent_state() == "stale", 15, "the node goes stale")
        recorded = bytes(proxy.recordings[0])
        assert len(recorded) > 100
        with socket.create_connection(("127.0.0.1", head.listen_port), timeout=5) as s:
            s.sendall(recorded)
            for _ in range(20):  # right away (a replayed report would be fresh for 3 s), and on
                assert head.agent_state() == "stale"
                time.sleep(0.1)
        assert head.health().get("rejected_bad_token", 0) >= 1
    finally:
        head.stop()


@pytest.mark.fault
def test_a_wrong_token_is_named_once_and_backed_off(tmp_path: Path, token: Path, fault: FaultRecord) -> None:
    """Positive control: have the head close without a rejection (no reason), or reset the
    backoff on rejection: the line or the bound on attempts fails."""
    fault.expect(
        "node agent with a wrong token",
        "the agent logs 'token rejected' once and backs off (1, 2, 4 s); never 'connected'",
    )
    head = Head(tmp_path / "head.log", token)
    wrong = tmp_path / "wrong"
    wrong.write_text("not the token, 0123456789\n")
    wrong.chmod(0o600)
    agent = push_agent(head.listen_port, NODE, ENV, tmp_path / "push.log", wrong, 0.5)
    try:
        eventually(lambda: "token rejected" in agent.log_text(), 20, "the agent names the rejection")
        started = time.monotonic()
        first = head.health().get("rejected_bad_token", 0)
        time.sleep(6)
        attempts = head.health().get("rejected_bad_token", 0) - first
        elapsed = time.monotonic() - started
        # every 0.5 s without backoff (12 tries); 1, 2, 4 s with it
        assert 1 <= attempts <= 4, (attempts, elapsed)
        assert agent.log_text().count("token rejected") == 1
        fault.observe(f"'token rejected' logged once; {attempts} attempt(s) in {elapsed:.0f} s after it")
        assert "connected to head" not in agent.log_text()
        assert head.agent_state() == "absent"
    finally:
        agent.stop()
        head.stop()


@pytest.mark.fault
def test_a_head_that_accepts_but_never_reads_is_noticed_within_three_intervals(
    tmp_path: Path, token: Path, fault: FaultRecord
) -> None:
    """A listening socket nobody reads (the kernel completes the handshake). Before: the
    agent logged "connected" and sent into kernel buffers for hours."""
    interval = 1.0
    fault.expect("a head that accepts but never reads", "the agent says so within 3 intervals (1 s each)")
    silent = socket.create_server(("127.0.0.1", 0), backlog=8)
    try:
        agent = push_agent(silent.getsockname()[1], NODE, ENV, tmp_path / "push.log", token, interval)
        try:
            eventually(lambda: "unreachable" in agent.log_text(), 20, "the agent notices")
            text = agent.log_text()
            started = log_times(text, "node agent: sending")[0]
            noticed = log_times(text, "unreachable")[0]
            assert noticed - started <= 3 * interval, text
            assert "connected to head" not in text
            fault.observe(f"noticed {noticed - started:.1f} s after the agent started; never 'connected'")
        finally:
            agent.stop()
    finally:
        silent.close()


@pytest.mark.fault
@pytest.mark.parametrize("how", ["sigstop", "network cut"])
def test_a_stalled_head_is_noticed_within_three_intervals_and_the_agent_comes_back(
    tmp_path: Path, token: Path, proxy_factory: Callable[[int], Proxy], how: str, fault: FaultRecord
) -> None:
    """SIGSTOP the head, or stop a proxy between agent and head from forwarding. The agent
    must say so within 3 intervals (acknowledgement deadline; TCP keepalive covers idle
    links) and report again once the head is back. Positive control: raise
    ``Pusher.ack_deadline_s`` to 10 intervals."""
    interval = 2.0
    what = "head SIGSTOPped" if how == "sigstop" else "network cut between agent and head (a proxy stops)"
    fault.expect(what, "the agent says 'stalled' within 3 intervals (2 s each), reconnects and reports again")
    head = Head(tmp_path / "head.log", token, interval_s=interval)
    proxy = proxy_factory(head.listen_port)
    agent = push_agent(proxy.port, NODE, ENV, tmp_path / "push.log", token, interval)
    try:
        eventually(lambda: head.agent_state() == "reporting", 30, "the agent reports")
        taken = head.health()["reports_received"]
        eventually(lambda: head.health()["reports_received"] > taken, 3 * interval, "one more report")
        cut_at = time.time()
        if how == "sigstop":
            head.process.send_signal(signal.SIGSTOP)
        else:
            proxy.cut.set()
        eventually(lambda: "stalled" in agent.log_text(), 6 * interval, "the agent notices")
        noticed = log_times(agent.log_text(), "stalled")[0]
        assert noticed - cut_at <= 3 * interval, agent.log_text()
        fault.observe(f"'stalled' {noticed - cut_at:.1f} s after the fault")
        if how == "sigstop":
            head.process.send_signal(signal.SIGCONT)
        else:
            proxy.cut.clear()
        eventually(
            lambda: any(t > noticed for t in log_times(agent.log_text(), "connected to head")),
            40,
            "the agent reconnects",
        )
        eventually(lambda: head.agent_state() == "reporting", 20, "reports again")
        fault.observe("reconnected and reporting again after the head came back")
    finally:
        agent.stop()
        head.process.send_signal(signal.SIGCONT)
        head.stop()


class Dripper:
    """``count`` connections from 127.0.0.2 to 127.0.0.41, each sending one byte a second of
    a frame it never finishes (a version-2 header's first byte, then zeros); a connection the
    head drops is replaced. Runs in a thread until :meth:`stop`."""

    def __init__(self, port: int, count: int, sources: int = 40) -> None:
        self.port, self.count, self.sources = port, count, sources
        self.slots: list[Optional[socket.socket]] = [None] * count
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self, i: int) -> Optional[socket.socket]:
        s = socket.socket()
        try:
            s.bind((f"127.0.0.{2 + i % self.sources}", 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
        except OSError:
            s.close()
            return None
        self.opened += 1
        return s

    def _run(self) -> None:
        sent = [0] * self.count
        while not self._stop.is_set():
            for i in range(self.count):
                s = self.slots[i]
                if s is None:
                    self.slots[i], sent[i] = self._open(i), 0
                    continue
                try:
                    with contextlib.suppress(BlockingIOError):
                        while s.recv(4096):  # the greeting; b"" = closed
                            pass
                        raise ConnectionResetError
                    with contextlib.suppress(BlockingIOError):
                        s.send(b"\xa2" if sent[i] == 0 else b"\0")
                        sent[i] += 1
                except OSError:
                    s.close()
                    self.slots[i] = None
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for s in self.slots:
            if s is not None:
                s.close()


def test_eleven_hundred_dripping_connections_do_not_take_the_head_down(tmp_path: Path, token: Path) -> None:
    """A head held to 1024 file descriptors (soft and hard), a real agent reporting every
    second, and 1,100 connections that each drip a byte a second for 25 s. ``/healthz`` must
    answer within 3 s throughout, the agent must stay fresh, and the head's log must stay
    short. Before: the head ran out of descriptors, both ports stopped answering and asyncio
    logged every failed accept. Positive control: set ``FD_RESERVE`` to 0 and the connection
    cap lets the drip take every descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= 1400, "this test needs 1,400 descriptors for its own sockets"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400), hard))
    head = Head(tmp_path / "head.log", token, nofile=1024)
    agent = push_agent(head.listen_port, NODE, ENV, tmp_path / "push.log", token, 1.0)
    dripper: Optional[Dripper] = None
    try:
        eventually(lambda: head.agent_state() == "reporting", 30, "the agent reports")
        log_lines_before = len(head.log_text().splitlines())
        dripper = Dripper(head.listen_port, 1100)
        slowest, states = 0.0, set()
        until = time.monotonic() + 25
        while time.monotonic() < until:
            started = time.monotonic()
            code, body = head.get("/healthz", timeout_s=3)
            slowest = max(slowest, time.monotonic() - started)
            # The head's own health (its GCS is a closed port: "ok" says no scheduler view).
            assert code == 200 and json.loads(body)["gcs_poller"]["ok"] is True
            states.add(head.agent_state())
            time.sleep(0.5)
        health = head.health()
        assert dripper.opened >= 1100
        assert slowest < 3.0
        assert states == {"reporting"}, states
        assert health["connections_timed_out"] + health["connections_evicted"] > 0, health
        assert head.process.poll() is None
        assert "Too many open files" not in head.log_text()  # the cap keeps descriptors in reserve
        log_lines = len(head.log_text().splitlines()) - log_lines_before
        assert log_lines < 60, head.log_text()[-3000:]
    finally:
        if dripper is not None:
            dripper.stop()
        agent.stop()
        head.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_agents_and_status_work_over_tls_and_plain_clients_are_refused(tmp_path: Path, token: Path) -> None:
    """Mutual TLS: the head presents its certificate and requires clients signed by the CA.
    A TLS agent reports and ``status --head`` reads; a plain agent, a plain HTTP client and a
    TLS client without a certificate get nothing. Positive control: drop ``ssl=`` from the
    report server in ``Head.serve`` and the plain agent is taken."""
    pki = make_pki(tmp_path)
    context = ssl.create_default_context(cafile=str(pki["ca.pem"]))
    context.load_cert_chain(str(pki["client.pem"]), str(pki["client.key"]))
    server_tls = tls_options(pki, "head")
    client_tls = tls_options(pki, "client")
    head = Head(tmp_path / "head.log", token, extra=tuple(server_tls), ssl_context=context)
    plain_node = "cd" * 28
    args = ["push", "--head", f"127.0.0.1:{head.listen_port}", "--interval", "1", "--token-file", str(token)]
    agent = Daemon([*args, "--node-id", NODE, *client_tls], ENV, tmp_path / "push.log")
    plain = Daemon([*args, "--node-id", plain_node], ENV, tmp_path / "plain.log")
    try:
        eventually(lambda: head.agent_state() == "reporting", 30, "the TLS agent reports")
        done = run_rayscope(
            "status", "--head", f"https://127.0.0.1:{head.http_port}", "--token-file", str(token),
            "--json", "--all", *client_tls, env=ENV,
        )  # fmt: skip
        assert done.returncode in (0, 1), done.stderr
        assert parsed(done.stdout, "status")["nodes"][NODE]["agent"] == "reporting"
        eventually(  # before: "unreachable: the head closed the connection before greeting"
            lambda: "speaks TLS: pass --tls-ca" in plain.log_text(), 20, "the plain agent is refused"
        )
        assert head.agent_state(plain_node) == "absent"
        assert "connected to head" not in plain.log_text()
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", head.http_port, timeout=5)
        try:  # closed here: a failed send leaves its socket open in conn (http.client closes none)
            with pytest.raises((OSError, ConnectionError)):
                conn.request("GET", "/healthz")
                conn.getresponse()
        finally:
            conn.close()
        no_cert = run_rayscope(
            "status", "--head", f"https://127.0.0.1:{head.http_port}", "--token-file", str(token),
            "--tls-ca", str(pki["ca.pem"]), env=ENV,
        )  # fmt: skip
        assert no_cert.returncode == 2 and "unreachable" in no_cert.stderr, no_cert.stderr
        assert len(no_cert.stderr.splitlines()) == 1
    finally:
        agent.stop()
        plain.stop()
        head.stop()


def test_http_worker_threads_are_bounded(tmp_path: Path, token: Path) -> None:
    """60 HTTP connections that never send a request hold at most HTTP_WORKERS threads, and
    the head answers again once they go. Before: one thread per connection. Positive
    control: make ``BoundedHTTPServer.process_request`` skip the semaphore."""
    import psutil

    from rayscope.head.serve.http import HTTP_WORKERS

    head = Head(tmp_path / "head.log", token)
    idle: list[socket.socket] = []
    try:
        process = psutil.Process(head.process.pid)

        def settled() -> Optional[int]:  # the GCS poller and the executor: the same count twice
            first = process.num_threads()
            time.sleep(0.5)
            return first if process.num_threads() == first else None

        base = eventually(settled, 20, "the head's thread count settles")
        for _ in range(60):  # each kept as it is made: closed below if a later one fails
            idle.append(socket.create_connection(("127.0.0.1", head.http_port), timeout=5))

        def held() -> bool:  # accepted by the head: its own sockets, not the kernel's backlog
            port = head.http_port
            mine = [c for c in process.net_connections("tcp") if c.laddr and c.laddr.port == port]
            return len([c for c in mine if c.status == psutil.CONN_ESTABLISHED]) >= len(idle)

        eventually(held, 20, f"the head holds the {len(idle)} idle connections")
        threads = psutil.Process(head.process.pid).num_threads()
        assert threads - base <= HTTP_WORKERS + 2, (base, threads)  # main: 53 more
        for s in idle:
            s.close()
        eventually(lambda: head.get("/healthz", timeout_s=3)[0] == 200, 20, "the head answers again")
    finally:
        for s in idle:
            s.close()
        head.stop()


@pytest.mark.fault
def test_a_whole_cluster_reconnecting_at_once_waits_in_the_listen_queue(
    tmp_path: Path, token: Path, fault: FaultRecord
) -> None:
    """1,000 agents dial a head that is busy (SIGSTOPped, so it accepts nothing) at once, as
    a cluster does when its head restarts. The kernel must complete every handshake and hold
    it until the head accepts; each must then get its greeting. Before: the listen queue was
    asyncio's accept batch (64), the kernel dropped every SYN past it, and the 2,000-agent
    soak lost 257 agents to connect timeouts while the SYNs were retried."""
    agents = 1000
    fault.expect(
        "1,000 agents dial a busy head at once (SIGSTOPped, as after a restart)",
        "the kernel completes every handshake within 2 s; each gets its greeting once the head runs",
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= agents + 200, "this test needs 1,200 descriptors for its own sockets"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, agents + 200), hard))
    head = Head(tmp_path / "head.log", token, extra=("--max-pending", str(agents + 64)))
    socks: list[socket.socket] = []
    try:
        head.process.send_signal(signal.SIGSTOP)
        for _ in range(agents):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", head.listen_port))
            socks.append(s)
        poller = select.poll()
        for s in socks:
            poller.register(s, select.POLLOUT)
        connected: set[int] = set()
        until = time.monotonic() + 2.0  # a dropped SYN is first retried after 1 s, then 3 s
        while len(connected) < agents and time.monotonic() < until:
            for fd, events in poller.poll(100):
                if events & select.POLLOUT:
                    connected.add(fd)
                    poller.unregister(fd)
        assert len(connected) == agents, f"only {len(connected)} of {agents} handshakes completed"
        head.process.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        greeted = 0
        deadline = time.monotonic() + 30
        for s in socks:
            s.setblocking(True)
            s.settimeout(max(0.1, deadline - time.monotonic()))
            data = b""
            with contextlib.suppress(OSError):
                while len(data) < wire.GREETING_BYTES:
                    chunk = s.recv(64)
                    if not chunk:
                        break
                    data += chunk
            greeted += len(data) >= wire.GREETING_BYTES
        assert greeted == agents, f"{greeted} of {agents} got a greeting"
        fault.observe(
            f"{len(connected)} of {agents} handshakes completed while the head was stopped;"
            f" {greeted} greeted {time.monotonic() - resumed:.1f} s after it ran again"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            head.process.send_signal(signal.SIGCONT)
        for s in socks:
            s.close()
        head.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
