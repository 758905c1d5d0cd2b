"""The node agent: collect this node's report every interval and send it to the head.

One persistent TCP (or TLS) connection; one reused msgspec encoder; no queue — each cycle
collects a fresh report, so after an outage the head gets the latest state, never a backlog.
The head greets each connection with a challenge and acknowledges each frame
(:mod:`rayscope.net.wire`). When the head is away, rejects a report (a wrong token) or stops
acknowledging (stalled, or the network cut: TCP keepalive plus an acknowledgement deadline of
two intervals), the agent drops the connection and retries with capped exponential backoff;
a failure retrying cannot fix (a wrong token, the wrong port) ends it after a few tries
(:mod:`rayscope.node.give_up`). It logs one line per state change (connected, rejected,
lost, raylet found or gone), not one per cycle, and stops cleanly on SIGTERM.
"""

import errno
import logging
import os
import random
import select
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Optional

import msgspec

from rayscope.errors import EXIT_USAGE, AgentError
from rayscope.net import peer, tokens, wire
from rayscope.net.addresses import split_address
from rayscope.net.tls import TlsFiles, client_context
from rayscope.node import collect
from rayscope.node.cuda_samples import CudaSamples
from rayscope.node.give_up import Hopeless
from rayscope.schema.report import GpuDevice, NodeReport, RayletInfo
from rayscope.sources import raylet
from rayscope.sources.nvml import devices as nvml

log = logging.getLogger("rayscope.push")

JITTER = 0.1
"""Each wait is the interval ± 10%, so a fleet started together does not report in lockstep."""
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
ACK_POLL_S = 0.25
ACK_WAIT_S = 0.5
"""After a send, how long to wait for its acknowledgement before the next cycle checks again."""
RESCAN_CYCLES = 10
"""While no raylet is found, look again every this many cycles (a scan costs ~7 ms)."""


def started_by(environ: Optional[Mapping[str, str]] = None) -> str:
    """How this agent was started, as ``status`` shows it: ``systemd`` (a service: systemd
    sets ``INVOCATION_ID``) or ``manual``; an agent placed through Ray says ``ray``."""
    return "systemd" if "INVOCATION_ID" in (os.environ if environ is None else environ) else "manual"


class Pusher:
    """Collects and sends; :meth:`run` loops until :meth:`stop`."""

    def __init__(
        self,
        head: tuple[str, int],
        token: bytes,
        interval_s: float,
        node_id: Optional[str] = None,
        clock: Callable[[], float] = time.time,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        self.head = head
        self._where = f"{head[0]}:{head[1]}"
        self.token = token
        self.interval_s = interval_s
        self.node_id = node_id
        self.clock = clock
        self._encoder = msgspec.msgpack.Encoder()
        self.ssl_context = ssl_context
        self.ack_deadline_s = max(1.5 * interval_s, 1.0)
        """A frame not acknowledged this long after it was sent means a stalled head."""
        self._sock: Optional[socket.socket] = None
        self._sealer = wire.Sealer(token, b"")
        self._acks = wire.AckReader()
        self._acked = 0
        self._unacked_since: Optional[float] = None
        self._trimmed = False
        self._stop = threading.Event()
        self._backoff_s = BACKOFF_START_S
        self.hopeless = Hopeless()
        self._head_state = ""
        self._raylet_state = ""
        self._known: Optional[RayletInfo] = None
        self._ambiguous = self._gone = ""  # _gone: the node whose raylet ran here last
        self._cycles_since_scan = RESCAN_CYCLES  # scan on the first cycle
        self.started_by = started_by()
        self.cuda = CudaSamples.from_env(os.environ)
        """CUDA samples of GPUs whose NVML used figure is not trusted (``RAYSCOPE_CUDA_SAMPLE_S``)."""

    def _raylet(self) -> Optional[RayletInfo]:
        """The raylet to report for; the process table is scanned only when it is gone
        (and, while none is found, every ``RESCAN_CYCLES`` cycles). Raylets of two clusters
        and no ``--node-id``: none (the host only), as ``status`` refuses to guess."""
        if self._known is not None and raylet.still_running(self._known):
            return self._known
        if self._known is None and self._cycles_since_scan < RESCAN_CYCLES:
            self._cycles_since_scan += 1
            return None
        raylets, _ = raylet.find_raylets()
        self._ambiguous = "" if self.node_id else raylet.clusters_here(raylets)
        self._known = None if self._ambiguous else raylet.pick_raylet(raylets, self.node_id)
        self._cycles_since_scan = 0
        return self._known

    def collect(self) -> NodeReport:
        """This node's report: the pinned raylet (or the local one; once it is gone, still its
        node), NVML, host."""
        mine = self._raylet()
        if mine is not None:
            self._gone = mine.node_id
            self._note_raylet(f"reporting for Ray node {mine.node_id} (raylet pid {mine.pid})")
        elif self.node_id:
            self._note_raylet(f"no local raylet has node id {self.node_id}: reporting it without one")
        elif self._ambiguous:
            self._note_raylet(f"{self._ambiguous}: pass --node-id; reporting the host only")
        elif self._gone:  # one node, shown dead once Ray says so; never a second, host-only one
            self._note_raylet(f"the raylet of Ray node {self._gone} is gone: reporting that node without it")
        else:
            self._note_raylet("no raylet on this host: reporting the host only")
        # A hung driver call must not cost the loop its interval: half of it at most.
        timeout = min(nvml.TIMEOUT_S, self.interval_s / 2)
        report = collect.local_report(mine, self.clock(), timeout, self.cuda)
        report.interval_s = self.interval_s
        report.started_by = self.started_by
        if mine is None and (self.node_id or self._gone) and not self._ambiguous:
            report.node_id = self.node_id or self._gone
        return report

    def _note_raylet(self, state: str) -> None:
        if state != self._raylet_state:
            log.info("%s", state)
            self._raylet_state = state

    def _note_head(self, state: str, warning: bool = False) -> None:
        if state != self._head_state:
            (log.warning if warning else log.info)("%s", state)
            self._head_state = state

    def _connection(self) -> socket.socket:
        """The connection to the head, greeted: a new one when there is none."""
        if self._sock is None:
            sock = socket.create_connection(self.head, timeout=self.ack_deadline_s)
            try:
                keepalive(sock, self.interval_s)
                if self.ssl_context is not None:
                    sock = self.ssl_context.wrap_socket(sock, server_hostname=self.head[0])
                greeting = _recv_exactly(sock, wire.GREETING_BYTES)
                self._sealer = wire.Sealer(self.token, wire.parse_greeting(greeting))
            except (OSError, wire.FrameError) as err:
                sock.close()
                silent = isinstance(err, (TimeoutError, socket.timeout))
                wrong = peer.wrong_report_port(self.head, self.ssl_context is not None, silent)
                if wrong:
                    raise peer.WrongPort(wrong) from None
                raise
            except BaseException:
                sock.close()
                raise
            self._sock, self._acks = sock, wire.AckReader()
            self._acked, self._unacked_since = 0, None
        return self._sock

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _read_acks(self, wait_s: float) -> Optional[str]:
        """Take what the head sent back (waiting up to ``wait_s`` for the latest frame's ack);
        the reason if it rejected a frame. ``OSError`` if it closed the connection."""
        sock = self._sock
        assert sock is not None
        deadline = time.monotonic() + wait_s
        while True:
            ready = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
            if not ready:
                ready = bool(select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0])
            if not ready:
                return None
            sock.settimeout(self.ack_deadline_s)
            data = sock.recv(4096)
            if not data:
                raise ConnectionResetError(errno.ECONNRESET, "the head closed the connection")
            for seq, reason in self._acks.feed(data):
                if reason is not None:
                    return reason
                self._acked = max(self._acked, seq)
            if self._acked >= self._sealer.seq:
                self._unacked_since = None
                return None
            if time.monotonic() >= deadline:
                return None

    def _lost(self, err: BaseException) -> bool:
        """The connection failed: drop it, say so once, back off. Always ``False``."""
        self._close()
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        self._note_head(f"head {self._where} unreachable: {reason} (retrying with backoff)", warning=True)
        return False

    def _refused(self, rejected: str) -> bool:
        """The head rejected a frame: drop the connection, say why once, back off. ``False``;
        :class:`~rayscope.errors.AgentError` on the last try of a wrong token (``give_up``)."""
        self._close()
        what = f"head {self._where} rejected the report: {wire.rejection_text(rejected, bool(self.token))}"
        self._note_head(f"{what} (retrying with backoff)", warning=True)
        if rejected == wire.BAD_TOKEN:  # a wrong token or none: the same on every try
            self.hopeless.again(what)
        return False

    def send(self, report: NodeReport) -> bool:
        """Send one report; ``False`` (and the connection dropped) if the head is away, stalled
        or rejected it."""
        payload = self.encode(report)
        try:
            sock = self._connection()
            rejected = self._read_acks(0.0)  # the previous frame's answer
            if rejected is None and self._stalled():
                raise TimeoutError(errno.ETIMEDOUT, f"no acknowledgement for {self.ack_deadline_s:g} s")
            if rejected is None:
                sock.settimeout(self.ack_deadline_s)
                sock.sendall(self._sealer.seal(payload))
                if self._unacked_since is None:
                    self._unacked_since = time.monotonic()
                rejected = self._read_acks(min(ACK_WAIT_S, self.interval_s / 2))
        except peer.WrongPort as err:
            self._close()
            self._note_head(f"head {self._where} {err} (retrying with backoff)", warning=True)
            self.hopeless.again(f"head {self._where} {err}")
            return False
        except (OSError, wire.FrameError) as err:
            return self._lost(err)
        if rejected is not None:
            return self._refused(rejected)
        self._note_head(f"connected to head {self._where}")
        self._backoff_s = BACKOFF_START_S
        self.hopeless.reset()
        return True

    def _stalled(self) -> bool:
        """The oldest frame not acknowledged is older than the deadline: the head stopped
        taking reports, or the network between is cut."""
        return (
            self._unacked_since is not None and time.monotonic() - self._unacked_since > self.ack_deadline_s
        )

    def encode(self, report: NodeReport) -> bytes:
        """The report's bytes; a report too big for a frame loses its process lists (logged)."""
        payload = self._encoder.encode(report)
        if len(payload) <= wire.MAX_PAYLOAD_BYTES:
            self._trimmed = False
            return payload
        trimmed = msgspec.structs.replace(
            report,
            processes=None,
            gpus=[_without_processes(g) for g in report.gpus] if report.gpus is not None else None,
        )
        smaller = self._encoder.encode(trimmed)
        if not self._trimmed:
            self._trimmed = True
            log.warning(
                "report of %d bytes exceeds the %d-byte frame: sent without its process lists (%d bytes)",
                len(payload),
                wire.MAX_PAYLOAD_BYTES,
                len(smaller),
            )
        return smaller

    def next_wait(self, sent: bool) -> float:
        """The interval with jitter after a send; 1, 2, 4 … 30 s while the head is away."""
        if sent:
            return self.interval_s * random.uniform(1 - JITTER, 1 + JITTER)
        wait, self._backoff_s = self._backoff_s, min(self._backoff_s * 2, BACKOFF_MAX_S)
        return wait

    def run(self, handle_signals: bool = True) -> None:
        """Collect and send until stopped; SIGTERM, SIGINT too (given back after) but in a Ray worker."""
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        saved = {sig: signal.signal(sig, lambda *_: self.stop()) for sig in signals}
        log.info("node agent: sending to %s:%d every %g s", *self.head, self.interval_s)
        if self.cuda is not None:
            log.info("CUDA samples of vGPU guests' GPUs at most every %g s", self.cuda.sampler.min_interval_s)
        try:
            while not self._stop.is_set():
                sent = self.send(self.collect())
                if not self._wait(self.next_wait(sent)):
                    self._stop.wait(self.next_wait(False))
            self.say_goodbye()
        finally:
            self._close()
            for sig, handler in saved.items():  # as it found them (an embedding program's own)
                signal.signal(sig, handler)
            log.info("node agent stopped")

    def say_goodbye(self) -> None:
        """A clean stop: tell the head (an empty frame, :data:`rayscope.net.wire.GOODBYE`), so it
        shows ``no agent`` at once, not stale later. One short try: a head away sees it go stale."""
        if self._sock is None:
            return
        try:
            self._sock.settimeout(min(1.0, self.ack_deadline_s))
            self._sock.sendall(self._sealer.seal(wire.GOODBYE))
            self._read_acks(min(1.0, self.ack_deadline_s))
        except (OSError, wire.FrameError):
            pass

    def _wait(self, seconds: float) -> bool:
        """Sleep until the next cycle, watching for the acknowledgement of the frame just sent:
        if it is late past the deadline, drop the connection at once (the next cycle connects
        anew), so a stalled head is noticed within the deadline, not a cycle later. ``False``
        if the connection broke meanwhile."""
        until = time.monotonic() + seconds
        while not self._stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return True
            if self._sock is None or self._unacked_since is None:
                self._stop.wait(left)
                return True
            self._stop.wait(
                min(left, ACK_POLL_S, max(0.0, self._unacked_since + self.ack_deadline_s - time.monotonic()))
            )
            try:
                rejected = self._read_acks(0.0)
            except (OSError, wire.FrameError) as err:
                return self._lost(err)
            if rejected is not None:
                return self._refused(rejected)
            if self._stalled():
                self._close()
                self._note_head(
                    f"head {self._where} stalled: no acknowledgement for {self.ack_deadline_s:g} s"
                    " (reconnecting)",
                    warning=True,
                )
                return False
        return True

    def stop(self) -> None:
        self._stop.set()


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError(errno.ECONNRESET, "the head closed the connection before greeting")
        data += chunk
    return data


def keepalive(sock: socket.socket, interval_s: float) -> None:
    """TCP keepalive probes after one interval of silence, three unanswered = dead, and
    unacknowledged data given up after three intervals (Linux): a cut network is noticed
    even between frames."""
    seconds = max(1, int(interval_s))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", seconds), ("TCP_KEEPINTVL", seconds), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(3 * interval_s * 1000))


def _without_processes(gpu: GpuDevice) -> GpuDevice:
    return msgspec.structs.replace(
        gpu, processes=None, mig_devices=[_without_processes(m) for m in gpu.mig_devices]
    )


def run(
    head: str, token_file: Optional[str], interval_s: float, node_id: Optional[str], tls: TlsFiles
) -> None:
    """``rayscope push``: send this node's report to ``head`` (``HOST:PORT``) until SIGTERM."""
    try:
        context = client_context(tls)
    except ValueError as err:
        raise AgentError(str(err), EXIT_USAGE) from None
    token = tokens.read_token(token_file)
    raylets = raylet.find_raylets()[0]
    ambiguous = "" if node_id else raylet.clusters_here(raylets)
    if ambiguous:
        raise AgentError(
            f"{ambiguous}: pass --node-id of the node to report for (`rayscope node` lists them)",
            EXIT_USAGE,
        )
    mistake = raylet.node_id_mistake(raylets, node_id) if node_id else ""
    if mistake:  # an id none of this host's raylets has: a typo, not a node of its own
        raise AgentError(mistake, EXIT_USAGE)
    Pusher(split_address(head), token, interval_s, node_id, ssl_context=context).run()
