"""Frames between node agents and the head: greeting, authentication, order, acknowledgement.

Knows no field of the reports: a frame carries opaque bytes. Version 2 on the wire::

    head  -> agent  greeting:  b"RSC" 0x02 | challenge (16 random bytes, new per connection)
    agent -> head   frame:     0xA2 | seq (8, big-endian) | length N (4) | header MAC (16)
                               | payload (N bytes) | frame MAC (32)
    head  -> agent  ack:       0x06 | seq (8)                        every frame taken, cumulative
                    rejection: 0x15 | seq (8) | n (1) | reason (n)   then the head closes

Both MACs are HMAC-SHA256 keyed with the token over the challenge first: the header MAC over
the 13 header bytes (truncated to 16 bytes), the frame MAC over the header and the payload.
So a frame is bound to its connection (a recorded frame fails on any other, whose challenge
differs) and to its place on it (the head takes only a sequence number above the last one).
The head checks the header MAC before it buffers a body: a peer without the token makes it
hold 29 bytes, never a megabyte. Without a token the MACs are keyed with the empty key and
only catch corruption.

Version 1 (``4-byte length | HMAC(token, payload) | payload``, no greeting, no ack) is still
read by the head for one release: its first byte is always 0 (lengths stay under 16 MiB),
which a version-2 header never starts with. It is not replay-safe.
"""

import hashlib
import hmac
import os
import struct
from typing import Optional

LENGTH = struct.Struct(">I")
TAG_BYTES = hashlib.sha256().digest_size
MAX_FRAME_BYTES = 1 << 20
"""1 MiB: a node report with 16 GPUs and hundreds of processes is a few tens of KiB."""
V1_PREAUTH_BYTES = 64 << 10
"""A version-1 frame carries its MAC after the body: until one has authenticated on a
connection, its frames may announce at most this many bytes (reports are far smaller)."""

GREETING_MAGIC = b"RSC\x02"
CHALLENGE_BYTES = 16
GREETING_BYTES = len(GREETING_MAGIC) + CHALLENGE_BYTES
V2 = 0xA2
HEADER = struct.Struct(">BQI")  # version, seq, payload length
HEADER_TAG_BYTES = 16
V2_HEADER_BYTES = HEADER.size + HEADER_TAG_BYTES
MAX_PAYLOAD_BYTES = MAX_FRAME_BYTES - V2_HEADER_BYTES - TAG_BYTES
"""The largest payload a version-2 frame holds (the whole frame stays within the cap)."""

ACK, REJECT = 0x06, 0x15
ACK_STRUCT = struct.Struct(">BQ")
ACK_BYTES = ACK_STRUCT.size

# Why the head rejected a frame: short words, sent to the agent and counted in /healthz.
BAD_TOKEN = "bad token"
BAD_FRAME = "bad frame"
TOO_BIG = "too big"
REPLAYED = "replayed"
BAD_REPORT = "bad report"
TIMEOUT = "timeout"
CLAIMED = "claimed"
"""Another connection owns the node this report is for (rayscope.head.store.reports)."""
WRONG_PEER = "wrong peer"
"""The scheduler has the node at another address than the report came from."""
FULL = "full"

GOODBYE = b""
"""An empty payload: the agent stops cleanly, and the head drops its node's report at once
(a crash leaves the report to go stale). An older head rejects it as a bad report, which
costs nothing: the agent is closing the connection anyway."""


class FrameError(Exception):
    """A frame that must be dropped, with the connection it came on; ``str()`` says why and
    ``reason`` is the short word the agent is told (``bad token``, ``too big`` ...)."""

    def __init__(self, message: str, reason: str = BAD_FRAME) -> None:
        super().__init__(message)
        self.reason = reason


# Version 1 -------------------------------------------------------------------------------


def tag(payload: bytes, token: bytes) -> bytes:
    return hmac.new(token, payload, hashlib.sha256).digest()


def seal_v1(payload: bytes, token: bytes) -> bytes:
    """One complete version-1 frame for ``payload`` (what agents before version 2 send)."""
    body_len = TAG_BYTES + len(payload)
    if body_len > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {body_len} bytes exceeds the {MAX_FRAME_BYTES}-byte cap", TOO_BIG)
    return LENGTH.pack(body_len) + tag(payload, token) + payload


seal = seal_v1
"""The previous release's name; new senders use :class:`Sealer` (version 2)."""


def body_length(header: bytes, max_bytes: int = MAX_FRAME_BYTES) -> int:
    """The body length a 4-byte version-1 header announces; :class:`FrameError` if it cannot
    be valid."""
    (length,) = LENGTH.unpack(header)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the {max_bytes}-byte cap", TOO_BIG)
    if length < TAG_BYTES:
        raise FrameError(f"frame of {length} bytes is shorter than its MAC")
    return int(length)


def open_body(body: bytes, token: bytes) -> bytes:
    """The payload of a version-1 body whose MAC checks out; :class:`FrameError` otherwise."""
    if len(body) < TAG_BYTES:
        raise FrameError("truncated frame")
    received, payload = body[:TAG_BYTES], body[TAG_BYTES:]
    if not hmac.compare_digest(received, tag(payload, token)):
        raise FrameError("bad MAC (wrong token?)", BAD_TOKEN)
    return payload


# Version 2 -------------------------------------------------------------------------------


def new_challenge() -> bytes:
    return os.urandom(CHALLENGE_BYTES)


def greeting(challenge: bytes) -> bytes:
    return GREETING_MAGIC + challenge


def parse_greeting(data: bytes) -> bytes:
    """The challenge in a head's greeting; :class:`FrameError` if it is not one."""
    if len(data) != GREETING_BYTES or not data.startswith(GREETING_MAGIC):
        raise FrameError("the peer did not greet as a rayscope head (version 2)")
    return data[len(GREETING_MAGIC) :]


class _Keyed:
    """HMAC-SHA256 keyed with the token, the connection's challenge already absorbed:
    each MAC is a copy of it (no re-keying per frame)."""

    def __init__(self, token: bytes, challenge: bytes) -> None:
        self._mac = hmac.new(token, challenge, hashlib.sha256)

    def header_tag(self, header: bytes) -> bytes:
        mac = self._mac.copy()
        mac.update(b"H")
        mac.update(header)
        return mac.digest()[:HEADER_TAG_BYTES]

    def frame_tag(self, header: bytes, payload: bytes) -> bytes:
        mac = self._mac.copy()
        mac.update(b"F")
        mac.update(header)
        mac.update(payload)
        return mac.digest()


class Sealer(_Keyed):
    """The agent's side of one connection: frames numbered 1, 2, 3 ..."""

    def __init__(self, token: bytes, challenge: bytes) -> None:
        super().__init__(token, challenge)
        self.seq = 0

    def seal(self, payload: bytes) -> bytes:
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise FrameError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}", TOO_BIG)
        self.seq += 1
        header = HEADER.pack(V2, self.seq, len(payload))
        return header + self.header_tag(header) + payload + self.frame_tag(header, payload)


class Opener(_Keyed):
    """The head's side of one connection: checks each header before its body is buffered,
    each frame's MAC, and that sequence numbers only go up."""

    def __init__(self, token: bytes, challenge: bytes) -> None:
        super().__init__(token, challenge)
        self.last_seq = 0

    def open_header(self, data: bytes) -> tuple[int, int]:
        """(seq, payload length) of a 29-byte header; :class:`FrameError` if it did not come
        from a holder of the token on this connection, or is out of order or too big."""
        header, received = data[: HEADER.size], data[HEADER.size : V2_HEADER_BYTES]
        version, seq, length = HEADER.unpack(header)
        if version != V2:
            raise FrameError(f"unknown frame version 0x{version:02x}")
        if not hmac.compare_digest(received, self.header_tag(header)):
            raise FrameError("bad header MAC (wrong token, or a frame from another connection)", BAD_TOKEN)
        if seq <= self.last_seq:
            raise FrameError(f"sequence number {seq} after {self.last_seq}: a replayed frame", REPLAYED)
        if length > MAX_PAYLOAD_BYTES:
            raise FrameError(f"payload of {length} bytes exceeds {MAX_PAYLOAD_BYTES}", TOO_BIG)
        return int(seq), int(length)

    def open_body(self, data: bytes, seq: int) -> bytes:
        """The payload of the body (payload and frame MAC) that followed header ``seq``."""
        payload, received = data[:-TAG_BYTES], data[-TAG_BYTES:]
        header = HEADER.pack(V2, seq, len(payload))
        if not hmac.compare_digest(received, self.frame_tag(header, payload)):
            raise FrameError("bad frame MAC", BAD_FRAME)
        self.last_seq = seq
        return payload


def ack(seq: int) -> bytes:
    return ACK_STRUCT.pack(ACK, seq)


def rejection(seq: int, reason: str) -> bytes:
    text = reason.encode("ascii", "replace")[:255]
    return ACK_STRUCT.pack(REJECT, seq) + bytes((len(text),)) + text


class AckReader:
    """The agent's parser of what the head sends back: feed bytes, get (seq, reason) pairs
    (reason ``None`` for an acknowledgement)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, Optional[str]]]:
        buffer = self._buffer
        buffer += data
        out: list[tuple[int, Optional[str]]] = []
        while len(buffer) >= ACK_BYTES:
            kind, seq = ACK_STRUCT.unpack_from(buffer)
            if kind == ACK:
                out.append((seq, None))
                del buffer[:ACK_BYTES]
            elif kind == REJECT:
                if len(buffer) < ACK_BYTES + 1 or len(buffer) < ACK_BYTES + 1 + buffer[ACK_BYTES]:
                    break
                end = ACK_BYTES + 1 + buffer[ACK_BYTES]
                out.append((seq, bytes(buffer[ACK_BYTES + 1 : end]).decode("ascii", "replace")))
                del buffer[:end]
            else:
                raise FrameError(f"unexpected byte 0x{kind:02x} from the head")
        return out


_EXPLAINED = {
    BAD_TOKEN: "token rejected (bad token): the head holds a different token; check --token-file",
    TOO_BIG: "too big: the report exceeds the head's frame cap",
    BAD_REPORT: "bad report: the head could not take it (is it older than this agent?)",
    CLAIMED: "claimed: another agent reports this node (two agents on one node? --node-id?)",
    WRONG_PEER: "wrong peer: the scheduler has this node at another address than this agent's",
    FULL: "full: the head holds as many nodes as it will",
}
NO_TOKEN = "the head requires a token and this agent has none: pass --token-file (the head's file)"


def rejection_text(reason: str, has_token: bool = True) -> str:
    """The head's short rejection word, said so that an operator knows what to fix (an agent
    with no token told so apart from one with another); a word this agent does not know is
    the peer's text, shown through the one printable rule."""
    from rayscope.labels import printable

    if reason == BAD_TOKEN and not has_token:
        return NO_TOKEN
    return _EXPLAINED.get(reason) or printable(reason)
