"""``status --head --json`` copies the head's indented document to stdout as it comes
(agent/rayscope/cli/fast_status.py ``_json_copy``, through the one transport's ``Sink``,
agent/rayscope/client/request.py): what it prints is what the CLI prints, it holds one part
of the document at a time, and no terminal escape of a bent wire reaches stdout.

Before (this change, measured on be6e352): the client took the compact document whole and
indented it (``msgspec.json.format``): 9 times a ``curl`` of it at 10,000 nodes, 35 MB.
Positive control: drop the ``escapes_a_terminal`` check in ``TerminalCopy`` and the escape sequence
is printed; make the sink return ``None`` and the memory test holds the whole document.
"""

import contextlib
import hashlib
import io
import socket
import sys
import tracemalloc
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from rayscope import __main__ as entry
from rayscope.cli import terminal_copy
from rayscope.net import http as net_http
from rayscope.schema import DOCUMENT_SCHEMA
from tests import scenarios
from tests.support.fake_head import fake_head, run_cli, run_entry
from tests.support.fake_server import FakeServer
from tests.support.ports import refused_port

if TYPE_CHECKING:
    from typing_extensions import Buffer

HEAD = (
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Rayscope-Exit: 0\r\n"
    f'X-Rayscope-Note: ""\r\nX-Rayscope-Notes: []\r\nX-Rayscope-Schema: {DOCUMENT_SCHEMA}\r\n'
    "X-Rayscope-Indent: 2\r\nContent-Length: {length}\r\n\r\n"
)
PART = net_http._RECV_BYTES


@contextlib.contextmanager
def raw_head(body: bytes, length: int = -1) -> Iterator[str]:
    """A head that answers every request with ``body`` under the indented document's headers
    (``length``: the ``Content-Length`` it claims, default the body's), then hangs up."""
    claimed = len(body) if length < 0 else length
    answer = HEAD.format(length=claimed).encode() + body  # made here: the tests measure memory

    def serve(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(answer)

    with FakeServer(serve, backlog=8) as server:
        yield server.url


def document(size: int) -> bytes:
    """Indented JSON of about ``size`` bytes: lines of printable ASCII and one non-ASCII name."""
    line = b'  "gpu-\xc3\xa9": "0123456789abcdef0123456789abcdef",\n'
    return b"{\n" + line * (size // len(line)) + b'  "end": 1\n}\n'


def test_the_head_s_indented_document_is_what_the_cli_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with fake_head(scenarios.mixed_status()) as head:
        argv = ["status", "--head", head.url, "--json", "--all"]
        fast = run_entry(argv, capsys, monkeypatch)
        assert fast == run_cli(argv, capsys)
        assert head.requests[0] == "/v1/status?indent=1&all=1"
    assert fast[0] == 1 and fast[2].startswith("rayscope: partial")  # the note, after the body


class Digest(io.RawIOBase):
    """A stdout that keeps only a digest of what it is given (capsys would keep it all)."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: "Buffer") -> int:
        self.sha.update(data)
        return memoryview(data).nbytes


class Kept(io.RawIOBase):
    """A stdout that keeps the bytes it is given, as they are (capsys decodes them)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: "Buffer") -> int:
        self.data += data
        return memoryview(data).nbytes


def test_a_document_of_many_parts_is_printed_whole_holding_one_part_at_a_time(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 MB: printed byte for byte, UTF-8 included, while the read holds about one part
    (before: the whole document, and its indented copy)."""
    body = document(20 * 2**20)
    printed = Digest()
    closed = f"127.0.0.1:{refused_port()}"
    with raw_head(body) as url:
        run_entry(["status", "--head", closed], capsys, monkeypatch)  # imports, before measuring
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(printed), encoding="utf-8"))
        monkeypatch.setattr(sys, "argv", ["rayscope", "status", "--head", url, "--json"])
        tracemalloc.start()
        try:
            with pytest.raises(SystemExit) as stopped:
                entry.main()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert stopped.value.code == 0
    assert printed.sha.digest() == hashlib.sha256(body).digest()
    assert peak < 8 * PART, peak  # a part, and imports; before: 2 x 20 MB


@pytest.mark.parametrize("where", [10, PART + 10], ids=["first part", "second part"])
def test_a_control_character_stops_the_copy_before_its_part_is_printed(
    where: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An escape sequence in the document (a wire without TLS that bent it): one line, exit
    2, and no byte of the part it is in printed (the parts before it were)."""
    body = bytearray(document(3 * PART))
    body[where : where + 4] = b"\x1b[2J"
    with raw_head(bytes(body)) as url:
        code, out, err = run_entry(["status", "--head", url, "--json"], capsys, monkeypatch)
    assert code == 2 and "\x1b" not in out
    assert out.encode() == bytes(body[: where // PART * PART])
    said = f"head agent at {url} answered a document with terminal escapes: the rest is not printed"
    assert err == f"rayscope: {said}\n"


def test_a_c1_control_split_between_two_parts_is_refused_in_the_second(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """U+009B (CSI) in UTF-8, its lead byte the first part's last: the first part is printed,
    the second refused."""
    body = bytearray(document(3 * PART))
    body[PART - 1 : PART + 1] = b"\xc2\x9b"
    printed = Kept()
    with raw_head(bytes(body)) as url:
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(printed), encoding="utf-8"))
        code, _, err = run_entry(["status", "--head", url, "--json"], capsys, monkeypatch)
    assert code == 2 and printed.data == body[:PART] and "terminal escapes" in err


@pytest.mark.parametrize(
    ("part", "escapes"),
    [
        (b'{\n  "a": "b"\n}\n', False),
        (b'"caf\xc3\xa9 \xc2\xa9 \xe2\x82\xac"', False),  # UTF-8: a C2 lead before a printable sign
        (b"x\rx\x08x\x07", False),  # move the cursor, beep: text a bent wire could rewrite anyway
        (b"x\x1b[2Jx", True),
        (b"x\x1b]52;c;aGk=\x07", True),  # OSC 52: write the clipboard
        (b"x\x0ex", True),
        (b"x\x0fx", True),
        (b"x\xc2\x9b2Jx", True),  # CSI as U+009B
        (b"x\xc2\x9d0;t\xc2\x9c", True),
        (b"x\xc2", False),  # a lead at the end: its part is fine, the next says
    ],
)
def test_what_escapes_a_terminal(part: bytes, escapes: bool) -> None:
    assert terminal_copy.escapes_a_terminal(part) is escapes
    assert terminal_copy.escapes_a_terminal(bytearray(part)) is escapes


def test_a_lead_byte_at_a_part_s_end_is_judged_with_the_next_part() -> None:
    assert terminal_copy.escapes_a_terminal(b"\x9b[2J", after_lead=True)
    assert not terminal_copy.escapes_a_terminal(b"\xa9 2026", after_lead=True)


def test_a_document_cut_short_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = document(PART + 1000)
    with raw_head(body, length=len(body) + 5000) as url:
        code, out, err = run_entry(["status", "--head", url, "--json", "--timeout", "5"], capsys, monkeypatch)
    assert code == 2 and len(out.encode()) == PART
    assert err == f"rayscope: head agent at {url} answered a body that ended before its length\n"


def test_a_head_of_the_previous_release_is_indented_here(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head that ignores ``indent=1`` (no ``X-Rayscope-Indent``): its compact document is
    indented by the client, the same bytes."""
    with fake_head(scenarios.seed_status(), "compact") as head:
        argv = ["status", "--head", head.url, "--json"]
        assert run_entry(argv, capsys, monkeypatch) == run_cli(argv, capsys)
