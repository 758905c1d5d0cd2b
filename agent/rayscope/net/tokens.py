"""Token files: the shared secret of a head and its agents, and the head's read-only token.

One reader for every command (SECURITY.md, rule 5). A token is one line of printable ASCII
(surrounding whitespace stripped), at least :data:`MIN_TOKEN_BYTES` long, in a file that only
its owner can read or write; anything else is refused in one line that names the file and the
fix, never the token or a part of it.
"""

import os
import stat
from typing import Optional

from rayscope.errors import EXIT_USAGE, AgentError

MAX_TOKEN_FILE_BYTES = 64 * 1024
MAKE_ONE = "e.g. `openssl rand -hex 32 > FILE && chmod 600 FILE`"
MIN_TOKEN_BYTES = 16
"""The shortest token taken: 16 printable bytes (128 bits from ``openssl rand -hex 16``).
The head answers wrong tokens slowly (:mod:`rayscope.head.access.guesses`), but a token of a few
bytes is guessed anyway; every reader refuses it, so the head does not start with one."""


def read_token_file(
    path: Optional[str], shared_read: bool = False, min_bytes: int = MIN_TOKEN_BYTES
) -> bytes:
    """The token in ``path``; ``b""`` when no file is given; ``ValueError`` (one line) when
    the file is unreadable, open to group or others, empty, not one printable line, or
    shorter than :data:`MIN_TOKEN_BYTES`. ``shared_read``: a file others may read is taken
    (Ray's own token file: ``ray get-auth-token --generate`` writes ``~/.ray/auth_token``
    mode 644), one others may write is not. ``min_bytes``: Ray's token is Ray's to size (1)."""
    if path is None:
        return b""
    try:  # O_NONBLOCK: a FIFO at the path is refused below, never waited on
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise ValueError(f"cannot read token file {path}: {err.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode  # of the file read, not of whatever the path names later
        if stat.S_ISDIR(mode):
            raise ValueError(
                f"token file {path} is a directory: name the file in it that holds the token"
                f" (e.g. {os.path.join(path, 'token')})"
            )
        if not stat.S_ISREG(mode):
            raise ValueError(f"token file {path} is not a regular file: name the file that holds the token")
        if mode & (0o022 if shared_read else 0o066):
            raise ValueError(
                f"token file {path} is open to group or others (mode {mode & 0o777:03o}): `chmod 600 {path}`"
            )
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    except OSError as err:
        raise ValueError(f"cannot read token file {path}: {err.strerror}") from None
    finally:
        os.close(fd)
    return check_token(data, f"token file {path}", min_bytes)


def check_token(data: bytes, where: str, min_bytes: int = MIN_TOKEN_BYTES) -> bytes:
    """``data`` as a token, surrounding whitespace stripped: one line of printable ASCII, at
    most :data:`MAX_TOKEN_FILE_BYTES`; ``ValueError`` naming ``where`` (``token file PATH``,
    ``$RAY_AUTH_TOKEN``), never the token."""
    token = data.strip()
    if not token:
        raise ValueError(f"{where} is empty")
    if len(data) > MAX_TOKEN_FILE_BYTES or b"\n" in token or b"\r" in token:
        raise ValueError(f"{where} holds more than one line: a token is one line ({MAKE_ONE})")
    if any(byte < 0x20 or byte > 0x7E for byte in token):
        raise ValueError(
            f"{where} holds bytes that are not printable ASCII: a token is one line"
            f" of printable ASCII ({MAKE_ONE})"
        )
    if len(token) < min_bytes:
        raise ValueError(
            f"{where} holds a token of {len(token)} bytes: a token has at least {min_bytes} ({MAKE_ONE})"
        )
    return token


def read_token(path: Optional[str]) -> bytes:
    """:func:`read_token_file` for a command: its refusal is a one-line :class:`AgentError`
    (exit 2), as every command says it."""
    try:
        return read_token_file(path)
    except ValueError as err:
        raise AgentError(str(err), EXIT_USAGE) from None
