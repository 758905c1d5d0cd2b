"""The node agent: collect this node's report every interval and send it to the head.

One persistent TCP connection; one reused msgspec encoder; no queue — each cycle collects a
fresh report, so after an outage the head gets the latest state, never a backlog. When the
head is away the agent retries with capped exponential backoff. It logs one line per state
change (connected, lost, raylet found or gone), not one per cycle, and stops cleanly on
SIGTERM.
"""

import logging
import random
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Optional

import msgspec

from agent import collect, wire
from agent.model import NodeReport, RayletInfo
from agent.sources import nvml, raylet

log = logging.getLogger("rayscope.push")

JITTER = 0.1
"""Each wait is the interval ± 10%, so a fleet started together does not report in lockstep."""
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
SOCKET_TIMEOUT_S = 10.0
RESCAN_CYCLES = 10
"""While no raylet is found, look again every this many cycles (a scan costs ~7 ms)."""


class Pusher:
    """Collects and sends; :meth:`run` loops until :meth:`stop`."""

    def __init__(
        self,
        head: tuple[str, int],
        token: bytes,
        interval_s: float,
        node_id: Optional[str] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.head = head
        self.token = token
        self.interval_s = interval_s
        self.node_id = node_id
        self.clock = clock
        self._encoder = msgspec.msgpack.Encoder()
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._backoff_s = BACKOFF_START_S
        self._head_state = ""
        self._raylet_state = ""
        self._known: Optional[RayletInfo] = None
        self._cycles_since_scan = RESCAN_CYCLES  # scan on the first cycle

    def _raylet(self) -> Optional[RayletInfo]:
        """The raylet to report for; the process table is scanned only when it is gone
        (and, while none is found, every ``RESCAN_CYCLES`` cycles)."""
        if self._known is not None and raylet.still_running(self._known):
            return self._known
        if self._known is None and self._cycles_since_scan < RESCAN_CYCLES:
            self._cycles_since_scan += 1
            return None
        raylets, _ = raylet.find_raylets()
        self._known = raylet.pick_raylet(raylets, self.node_id)
        self._cycles_since_scan = 0
        return self._known

    def collect(self) -> NodeReport:
        """This node's report: the pinned raylet (or the local one), NVML, host."""
        mine = self._raylet()
        if mine is not None:
            self._note_raylet(f"reporting for Ray node {mine.node_id} (raylet pid {mine.pid})")
        elif self.node_id:
            self._note_raylet(f"no local raylet has node id {self.node_id}: reporting it without one")
        else:
            self._note_raylet("no raylet on this host: reporting the host only")
        # A hung driver call must not cost the loop its interval: half of it at most.
        report = collect.local_report(mine, self.clock(), min(nvml.TIMEOUT_S, self.interval_s / 2))
        report.interval_s = self.interval_s
        if mine is None and self.node_id:
            report.node_id = self.node_id
        return report

    def _note_raylet(self, state: str) -> None:
        if state != self._raylet_state:
            log.info("%s", state)
            self._raylet_state = state

    def _note_head(self, state: str, warning: bool = False) -> None:
        if state != self._head_state:
            (log.warning if warning else log.info)("%s", state)
            self._head_state = state

    def _peer_closed(self, sock: socket.socket) -> bool:
        """The head never writes: a readable socket means it closed or reset the connection."""
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _connection(self) -> socket.socket:
        if self._sock is not None and self._peer_closed(self._sock):
            self._close()
        if self._sock is None:
            self._sock = socket.create_connection(self.head, timeout=SOCKET_TIMEOUT_S)
            self._note_head(f"connected to head {self.head[0]}:{self.head[1]}")
        return self._sock

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def send(self, report: NodeReport) -> bool:
        """Send one report; ``False`` (and the connection dropped) if the head is away."""
        frame = wire.seal(self._encoder.encode(report), self.token)
        try:
            self._connection().sendall(frame)
        except OSError as err:
            self._close()
            reason = err.strerror or type(err).__name__
            where = f"{self.head[0]}:{self.head[1]}"
            self._note_head(f"head {where} unreachable: {reason} (retrying with backoff)", warning=True)
            return False
        self._backoff_s = BACKOFF_START_S
        return True

    def next_wait(self, sent: bool) -> float:
        """The interval with jitter after a send; 1, 2, 4 … 30 s while the head is away."""
        if sent:
            return self.interval_s * random.uniform(1 - JITTER, 1 + JITTER)
        wait, self._backoff_s = self._backoff_s, min(self._backoff_s * 2, BACKOFF_MAX_S)
        return wait

    def run(self) -> None:
        """Collect and send every interval until stopped (SIGTERM and SIGINT stop it)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        log.info("node agent: sending to %s:%d every %g s", *self.head, self.interval_s)
        try:
            while not self._stop.is_set():
                sent = self.send(self.collect())
                self._stop.wait(self.next_wait(sent))
        finally:
            self._close()
            log.info("node agent stopped")

    def stop(self) -> None:
        self._stop.set()
