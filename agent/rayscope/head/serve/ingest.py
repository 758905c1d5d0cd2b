"""The head's report port: one asyncio protocol per agent connection, bounded for strangers.

A connection is greeted with a random challenge (:mod:`rayscope.net.wire`); its frames are cut from a
byte buffer as data arrives (no coroutine and no timer per frame, so one core takes tens of
thousands of reports a second) and acknowledged, or rejected with a reason and closed.

What a peer without the token can hold is bounded:

* connections: at most ``max_total`` in all and ``max_unauth_per_host`` (256, ``head
  --max-pending``) not yet authenticated per source address; a new connection
  past either cap evicts the oldest unauthenticated one (of its address first), so a flood
  cannot lock out an agent that connects later, and an authenticated agent is never evicted;
* time: a frame must be complete ``FRAME_DEADLINE_S`` after its first byte (the greeting's
  TLS handshake too), and a silent connection is dropped after the idle timeout;
* memory: a version-2 header is checked (MAC) before its body is buffered; a version-1 frame
  may announce at most 64 KiB until one has authenticated on its connection;
* logs: per-connection events go through a :class:`LogThrottle` (one line per kind per
  interval, with counts), so a flood or running out of file descriptors cannot flood the log;
  a callback that raises (``MemoryError`` under a memory limit) closes its connection and is
  logged the same way (:mod:`rayscope.head.serve.callbacks`).
"""

import asyncio
import logging
import os
import socket
import time
from collections.abc import Hashable
from typing import Optional, Protocol

from rayscope.head.access.admission import ConnectionGuard
from rayscope.head.serve.callbacks import Guarded, ProtocolErrors, guarded
from rayscope.net import wire

log = logging.getLogger("rayscope.head")

FRAME_DEADLINE_S = 10.0
"""A frame (or a TLS handshake) must be complete this long after its first byte."""
ACCEPT_BACKLOG = 64
"""asyncio accepts up to this many connections in one go, before any of them is admitted."""
LISTEN_QUEUE = 4096
"""Connections the kernel completes and holds until the head accepts them (capped by
``net.core.somaxconn``). A cluster whose agents all reconnect at once, after a head restart,
waits here; a full queue drops SYNs, and each is retried only after 1, 3, 7 s."""
FD_RESERVE = 192 + ACCEPT_BACKLOG
"""File descriptors kept back from the report port: HTTP, the GCS client, logs, a burst of
accepts and connections closing."""


def widen_listen_queue(fd: int) -> None:
    """Set the kernel's listen queue of the listening socket ``fd`` to :data:`LISTEN_QUEUE`.

    asyncio passes one number, its ``backlog``, both to ``listen()`` and as how many sockets
    it accepts per loop pass; calling ``listen()`` again on the same socket (through a
    duplicate descriptor) changes only the kernel's queue and keeps the accept batch small."""
    with socket.socket(fileno=os.dup(fd)) as listening:
        listening.listen(LISTEN_QUEUE)


class ReportSink(Protocol):
    """Where a connection's reports go (:class:`rayscope.head.store.state.HeadState`)."""

    def take(self, payload: bytes, received_at: float, conn: Hashable, peer: str) -> Optional[str]:
        """Keep one report; its node id. An exception with a ``reason`` for one refused."""

    def goodbye(self, conn: Hashable) -> list[str]:
        """``conn``'s agent stopped cleanly; the nodes it reported."""

    def disconnected(self, conn: Hashable) -> None:
        """``conn`` is gone."""


class ReportProtocol(asyncio.Protocol, Guarded):
    """One agent's connection: greeting, frames (version 2, or version 1 for old agents),
    acknowledgements. Closed on a bad frame (after saying why), at EOF, after a silence, or
    when a frame is not complete ``FRAME_DEADLINE_S`` after its first byte."""

    port_name = "report"

    def __init__(
        self,
        sink: ReportSink,
        token: bytes,
        idle_timeout_s: float,
        guard: ConnectionGuard,
        errors: Optional[ProtocolErrors] = None,
    ) -> None:
        """``sink`` takes the reports (with this connection as their owner), a goodbye (an
        empty payload: the agent stops cleanly) and the news that the connection is gone;
        ``errors`` counts the callbacks that raised (the head's, for ``/healthz``)."""
        self._sink, self._token, self._idle_timeout_s, self._guard = sink, token, idle_timeout_s, guard
        self.log_throttle = guard.throttle
        self.protocol_errors = errors if errors is not None else ProtocolErrors()
        self._buffer = bytearray()
        self._opener: Optional[wire.Opener] = None
        self._version = 0  # 1 or 2 once the first frame byte says
        self._need: Optional[int] = None  # bytes of the body awaited (header read)
        self._seq = 0  # of the frame whose body is awaited
        self._frame_started: Optional[float] = None  # monotonic time of the current frame's first byte
        self._authed = False
        self._node: Optional[str] = None
        self.peer, self.host = "?", "?"
        self._last_data = time.monotonic()
        self._transport: Optional[asyncio.Transport] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._closed = False

    @guarded
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.host = str(peer[0]) if peer else "?"
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if not self._guard.admit(self):
            self._closed = True
            transport.abort()
            return
        self._last_data = time.monotonic()
        challenge = wire.new_challenge()
        self._opener = wire.Opener(self._token, challenge)
        transport.write(wire.greeting(challenge))
        self._timer = asyncio.get_running_loop().call_later(
            min(self._idle_timeout_s, FRAME_DEADLINE_S), self._check_time
        )

    @guarded
    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        now = time.monotonic()
        self._last_data = now
        buffer = self._buffer
        if not buffer and self._need is None:
            self._frame_started = now
        buffer += data
        used = 0
        try:
            used = self._frames(buffer, now)
        except wire.FrameError as err:
            self._reject(err)
        finally:
            del buffer[:used]

    def _frames(self, buffer: bytearray, now: float) -> int:
        """Take every complete frame in ``buffer`` and acknowledge the last (acks are
        cumulative: one write per batch); the bytes consumed."""
        received_at = now  # the head's monotonic clock: ages never follow the wall clock
        used, acked = 0, 0
        try:
            while True:
                if self._need is None:
                    if len(buffer) - used < 1:
                        break
                    if self._frame_started is None:
                        self._frame_started = now
                    used += self._read_header(buffer, used)
                    if self._need is None:
                        break
                if len(buffer) - used < self._need:
                    break
                body = bytes(buffer[used : used + self._need])
                used += self._need
                self._need = None
                self._frame_started = None
                self._take(self._open(body), received_at)
                acked = self._seq
        finally:
            if acked and self._version == 2 and self._transport is not None:
                self._transport.write(wire.ack(acked))
        return used

    def _take(self, payload: bytes, received_at: float) -> None:
        if payload == wire.GOODBYE:
            self._authenticated()
            gone = self._sink.goodbye(self)
            log.info("agent %s stopped: %s", self.peer, ", ".join(gone) or "no node")
            return
        try:
            node = self._sink.take(payload, received_at, self, self.host)
        except MemoryError:  # the head's, not the report's: the callback's guard closes
            raise
        except Exception as err:  # the state's ReportError (its reason), or a bug: never a crash
            raise wire.FrameError(str(err), getattr(err, "reason", wire.BAD_REPORT)) from None
        self._authenticated()
        if node != self._node:
            if self._node is None:  # the connection's first report: once per connection
                log.info("agent %s reports node %s", self.peer, node or "(no raylet)")
            else:  # a connection that changes node every frame must not flood the log
                self._guard.throttle.note(
                    "node-changed",
                    "agent %s now reports node %s",
                    self.peer,
                    node or "(no raylet)",
                    level=logging.INFO,
                )
            self._node = node

    def _read_header(self, buffer: bytearray, used: int) -> int:
        """Bytes of a header consumed from ``buffer[used:]`` (0: not all there yet)."""
        first = buffer[used]
        if self._version == 0:
            if first not in (0, wire.V2):
                raise wire.FrameError(f"not a rayscope frame (first byte 0x{first:02x})")
            self._version = 2 if first == wire.V2 else 1
        if self._version == 2:
            if len(buffer) - used < wire.V2_HEADER_BYTES:
                return 0
            assert self._opener is not None
            self._seq, length = self._opener.open_header(bytes(buffer[used : used + wire.V2_HEADER_BYTES]))
            self._need = length + wire.TAG_BYTES
            return wire.V2_HEADER_BYTES
        if len(buffer) - used < wire.LENGTH.size:
            return 0
        cap = wire.MAX_FRAME_BYTES if self._authed else wire.V1_PREAUTH_BYTES
        self._need = wire.body_length(bytes(buffer[used : used + wire.LENGTH.size]), cap)
        return wire.LENGTH.size

    def _open(self, body: bytes) -> bytes:
        if self._version == 2:
            assert self._opener is not None
            return self._opener.open_body(body, self._seq)
        payload = wire.open_body(body, self._token)
        self._guard.v1_frame(self.peer)
        return payload

    def _authenticated(self) -> None:
        if not self._authed:
            self._authed = True
            self._guard.authenticated(self)

    def _reject(self, err: wire.FrameError) -> None:
        self._guard.rejected(err.reason)
        self._guard.throttle.note(
            f"rejected:{err.reason}",
            "agent %s: rejected frame (%s): %s; connection dropped",
            self.peer,
            err.reason,
            err,
        )
        if self._version == 2 and self._transport is not None:
            self._transport.write(wire.rejection(self._seq, err.reason))
        self.close()

    @guarded
    def eof_received(self) -> bool:
        if self._buffer or self._need is not None:
            self._guard.rejected(wire.BAD_FRAME)
            self._guard.throttle.note(
                "truncated", "agent %s: truncated frame at end of stream; connection dropped", self.peer
            )
        return False  # close our side too

    @guarded
    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._closed = True
        self._guard.gone(self)  # a no-op for one never admitted
        if self._authed:
            self._sink.disconnected(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._authed:
            log.info("agent %s disconnected%s", self.peer, f": {exc}" if exc else "")

    @guarded
    def _check_time(self) -> None:
        """Drop a peer silent for the idle timeout, or whose frame is late (from its first byte)."""
        if self._closed:
            return
        now = time.monotonic()
        if self._frame_started is not None and now - self._frame_started >= FRAME_DEADLINE_S:
            self._guard.counters.timed_out += 1
            self._guard.rejected(wire.TIMEOUT)
            self._guard.throttle.note(
                "frame deadline",
                "agent %s: frame not complete %.0f s after its first byte; connection dropped",
                self.peer,
                FRAME_DEADLINE_S,
            )
            if self._version == 2 and self._transport is not None:
                self._transport.write(wire.rejection(self._seq, wire.TIMEOUT))
            self.close()
            return
        silent = now - self._last_data
        if silent >= self._idle_timeout_s:
            self._guard.counters.timed_out += 1
            self._guard.throttle.note(
                "idle", "agent %s: silent for %.0f s; connection dropped", self.peer, silent
            )
            self.close()
            return
        wait = self._idle_timeout_s - silent
        if self._frame_started is not None:
            wait = min(wait, FRAME_DEADLINE_S - (now - self._frame_started))
        elif not self._authed:
            wait = min(wait, FRAME_DEADLINE_S)
        self._timer = asyncio.get_running_loop().call_later(max(wait, 0.05), self._check_time)

    def close(self) -> None:
        """Hang up on this agent (the head's shutdown, a deadline, a rejected frame)."""
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()
