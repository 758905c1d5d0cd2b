"""Frames between node agents and the head: length, authentication, limits.

Knows no field of the reports: a frame carries opaque bytes. On the wire::

    4-byte big-endian length N | 32-byte HMAC-SHA256(token, payload) | payload (N - 32 bytes)

The MAC is always there; without a token it is keyed with the empty key and only catches
corruption, with one it authenticates the sender (constant-time compare). Frames longer than
the cap are refused before their body is read, so a bad peer cannot make the head buffer
gigabytes.
"""

import hashlib
import hmac
import struct

LENGTH = struct.Struct(">I")
TAG_BYTES = hashlib.sha256().digest_size
MAX_FRAME_BYTES = 1 << 20
"""1 MiB: a node report with 16 GPUs and hundreds of processes is a few tens of KiB."""


class FrameError(Exception):
    """A frame that must be dropped, with the connection it came on; ``str()`` says why."""


def tag(payload: bytes, token: bytes) -> bytes:
    return hmac.new(token, payload, hashlib.sha256).digest()


def seal(payload: bytes, token: bytes) -> bytes:
    """One complete frame for ``payload``."""
    body_len = TAG_BYTES + len(payload)
    if body_len > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {body_len} bytes exceeds the {MAX_FRAME_BYTES}-byte cap")
    return LENGTH.pack(body_len) + tag(payload, token) + payload


def body_length(header: bytes, max_bytes: int = MAX_FRAME_BYTES) -> int:
    """The body length a 4-byte header announces; :class:`FrameError` if it cannot be valid."""
    (length,) = LENGTH.unpack(header)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the {max_bytes}-byte cap")
    if length < TAG_BYTES:
        raise FrameError(f"frame of {length} bytes is shorter than its MAC")
    return int(length)


def open_body(body: bytes, token: bytes) -> bytes:
    """The payload of a frame body whose MAC checks out; :class:`FrameError` otherwise."""
    if len(body) < TAG_BYTES:
        raise FrameError("truncated frame")
    received, payload = body[:TAG_BYTES], body[TAG_BYTES:]
    if not hmac.compare_digest(received, tag(payload, token)):
        raise FrameError("bad MAC (wrong token?)")
    return payload
