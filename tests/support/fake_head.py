"""A fake head's HTTP port answering ``/v1/status`` from one status, and the two ways the tests
run ``rayscope`` against it in this process (the entry point, the typer CLI alone)."""

import contextlib
import http.server
import json
import ssl
import sys
from collections.abc import Iterator
from typing import Optional
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

from rayscope import __main__ as entry
from rayscope.cli import app as cli
from rayscope.core.completeness import assess
from rayscope.render.status import source_details, status_json, status_text_lines
from rayscope.schema import DOCUMENT_SCHEMA
from rayscope.schema.status import ClusterStatus
from tests import scenarios
from tests.support import fake_server

Run = tuple[int, str, str]


def planted() -> ClusterStatus:
    """A node whose host name carries an escape sequence and a line separator (a report
    that got past the head's own rule, or a wire that is not to be trusted)."""
    status = scenarios.seed_status()
    node_id, node = next(iter(status.nodes.items()))
    bent = msgspec.structs.replace(node, node_ip=None, hostname="gpu\x1b[2J-01\u2028x")
    return msgspec.structs.replace(status, nodes={**status.nodes, node_id: bent})


class FakeHead:
    """A head agent's HTTP port answering from one status (``mode``: what kind of head)."""

    def __init__(
        self, status: ClusterStatus, mode: str = "new", tls: Optional[ssl.SSLContext] = None
    ) -> None:
        self.status, self.mode = status, mode
        self.requests: list[str] = []
        head = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                head.requests.append(self.path)
                code, kind, body, headers = head.answer(self.path, self.headers.get("Authorization"))
                self.send_response(code)
                self.send_header("Content-Type", kind)
                for name, value in headers:
                    self.send_header(name, value)
                if head.mode == "chunked":
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:  # handshakes in accept(): a failed one is the server's OSError, and it serves on
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = fake_server.serve_forever(self.server)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"

    def answer(
        self, path: str, authorization: Optional[str]
    ) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        if self.mode.startswith("http-"):
            return int(self.mode[5:]), "text/plain; charset=utf-8", b"no\n", []
        query = parse_qs(urlsplit(path).query)
        include_dead, gpus = query.get("all") == ["1"], query.get("gpus") == ["1"]
        code, note = assess(self.status)
        headers = [
            ("X-Rayscope-Exit", str(code)),
            ("X-Rayscope-Note", json.dumps(note or "")),
            ("X-Rayscope-Notes", json.dumps(source_details(self.status.sources))),
            ("X-Rayscope-Schema", str(DOCUMENT_SCHEMA)),
        ]
        if self.mode == "old":
            headers = []
        elif query.get("format") == ["lines"]:
            lines = status_text_lines(self.status, include_dead, gpus)
            if self.mode == "bent":  # a wire (or a head) not to be trusted with a terminal
                lines = ["\x1b]0;owned\x07" + line + "\u2028\x1b[2J" for line in lines]
            return 200, "text/plain; charset=utf-8", ("\n".join(lines) + "\n").encode(), headers
        if query.get("indent") == ["1"] and self.mode != "compact":  # "compact": the previous release
            document = (status_json(self.status, include_dead) + "\n").encode()
            if self.mode == "bent":
                document = document.replace(b'"node_ip"', b'"\x1b]0;owned\x07node_ip"')
            return 200, "application/json", document, [*headers, ("X-Rayscope-Indent", "2")]
        document = status_json(self.status, include_dead, indent=0).encode()
        return 200, "application/json", document, headers

    def close(self) -> None:
        fake_server.stop(self.server, self.thread)


@contextlib.contextmanager
def fake_head(
    status: ClusterStatus, mode: str = "new", tls: Optional[ssl.SSLContext] = None
) -> Iterator[FakeHead]:
    head = FakeHead(status, mode, tls)
    try:
        yield head
    finally:
        head.close()


def run_entry(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """``rayscope ARGV`` through the entry point: the fast path, then the CLI."""
    monkeypatch.setattr(sys, "argv", ["rayscope", *argv])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    captured = capsys.readouterr()
    return int(stopped.value.code or 0), captured.out, captured.err


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Run:
    """``rayscope ARGV`` through the typer CLI alone."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    captured = capsys.readouterr()
    return int(stopped.value.code or 0), captured.out, captured.err
