"""``rayscope status`` before the typer CLI is imported: what it can do sooner, it does here.

``rayscope.__main__`` calls :func:`run` first, and imports :mod:`rayscope.cli.app` (typer, click,
the renderers: ~50 ms) only when it returns:

* ``status`` reading a head agent (``--head`` / ``$RAYSCOPE_HEAD``), as text or ``--json``
  on stdout: the head renders the answer (``GET /v1/status?format=lines``, or ``?indent=1``:
  the JSON as ``--json`` prints it, copied as it comes), with the exit code and the notes
  ``status`` prints on stderr in ``X-Rayscope-*`` headers; printed here, byte for byte what the
  CLI prints, with nothing imported beyond a socket (:mod:`rayscope.client.request`, the one
  transport of every ``--head`` read: the whole exchange within ``--timeout``, the body capped);
* ``status`` reading the GCS (no head): the GCS child is started at once
  (:mod:`rayscope.sources.gcs.prestart`): ``import ray``, most of the command's time, then
  runs while the CLI imports its own modules and finds the address.

Everything else goes to the CLI untouched, so that help, usage errors and every other
output read exactly as they always did: another command, an option this module does not
know or a value it would not take (the CLI then says why), ``--help``, ``--output``,
``--append``, ``--watch``, ``--format prom``, ``--gcs``; and a head whose answer this module
does not print itself (a refusal, whose meaning the CLI's path says; an older head, which
answers ``format=lines`` with JSON and no ``X-Rayscope-Exit``): the CLI then asks again, as it
always did, within what is left of the same ``--timeout`` (:func:`rayscope.net.deadline.carry`).
"""

import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

from rayscope.cli import names
from rayscope.cli.terminal_copy import TerminalCopy, escapes_a_terminal
from rayscope.defaults import (
    DASHBOARD_ENV,
    DEFAULT_TIMEOUT_S,
    HEAD_ENV,
    HEADER_EXIT,
    HEADER_INDENT,
    HEADER_NOTE,
    HEADER_NOTES,
    HEADER_SCHEMA,
    MAX_TIMEOUT_S,
)

if TYPE_CHECKING:
    from rayscope.net.http import Sink, Writer
    from rayscope.net.tls import TlsFiles

GLOBAL_FLAGS = names.VERBOSE.flags
FLAGS = {flag: n.key for n in names.STATUS if not n.takes_value for flag in n.flags}
VALUES = {flag: n.key for n in names.STATUS if n.takes_value for flag in n.flags}
ENVIRONMENT = {n.key: n.env for n in names.STATUS if n.env}
"""The variables the CLI's options read, by the parameter they fill (the same declarations)."""
HEAD_ONLY = tuple(n.key for n in (names.TOKEN_FILE, names.TLS_CERT, names.TLS_KEY, names.TLS_CA))
"""Options of a head read: given without a head, the CLI's (it ignores or refuses them)."""
GCS_ONLY = (names.DASHBOARD.key,)
"""Options of a GCS read: given with a head, the CLI's (it refuses them)."""
FORMATS = {"text": ("text", "json"), "gcs": ("text", "json", "prom")}


class Request(NamedTuple):
    """A ``status`` this module answers: what the CLI's options would hold."""

    head: Optional[str]
    """The head agent's URL; ``None``: the GCS (``gcs``, or found as the CLI finds it)."""
    gcs: Optional[str]
    token_file: Optional[str]
    timeout_s: float
    all_nodes: bool
    gpus: bool
    fmt: str
    tls: "Optional[TlsFiles]"
    verbose: bool
    dashboard: Optional[str] = None
    """``--dashboard``'s value (the GCS read's; ``$RAYSCOPE_DASHBOARD`` is read there)."""


def run(args: Sequence[str]) -> None:
    """Answer ``args`` here and exit when this module can; return to hand them to the CLI
    (having started the GCS child when the CLI will read the GCS)."""
    command = _status_words(args)
    if command is None:
        return
    verbose, words = command
    if "-h" in words or "--help" in words:
        return
    if not _names_a_head(words, os.environ):
        from rayscope.sources.gcs import prestart as gcs_prestart

        gcs_prestart.start()
    request = parse(words, verbose, os.environ)
    if request is None:
        return
    from rayscope.errors import one_line_errors

    with one_line_errors(verbose):
        code = answer_from_head(request) if request.head else answer_from_gcs(request)
    if code is not None:
        raise SystemExit(code)


def _status_words(args: Sequence[str]) -> Optional[tuple[bool, list[str]]]:
    """(``--verbose`` given, the words after ``status``) when ``args`` run ``status``."""
    i = 0
    while i < len(args) and args[i] in GLOBAL_FLAGS:
        i += 1
    if i >= len(args) or args[i] != "status":
        return None
    return i > 0, list(args[i + 1 :])


def _names_a_head(words: Sequence[str], environ: Mapping[str, str]) -> bool:
    given = any(w.partition("=")[0] in names.HEAD.flags for w in words)
    return given or bool(environ.get(HEAD_ENV))


def given_options(words: Sequence[str]) -> Optional[dict[str, Union[str, bool]]]:
    """The options ``words`` give, by name (flags ``True``), when every word is one this
    module knows, written as click reads it; ``None`` otherwise, and for a value that
    starts with ``-`` or an option given twice (the CLI's to read)."""
    given: dict[str, Union[str, bool]] = {}
    pending = list(words)[::-1]
    while pending:
        name, equals, value = pending.pop().partition("=")
        found: Union[str, bool]
        if name in FLAGS and not equals:
            key, found = FLAGS[name], True
        elif name in VALUES and (equals or pending):
            key, found = VALUES[name], value if equals else pending.pop()
        else:
            return None
        if key in given or (isinstance(found, str) and found.startswith("-")):
            return None
        given[key] = found
    return given


def parse(words: Sequence[str], verbose: bool, environ: Mapping[str, str]) -> Optional[Request]:
    """The request ``status WORDS`` makes, when this module answers it exactly as the CLI
    would; ``None`` otherwise (an unknown option, a value the CLI would refuse or that
    takes another path: the CLI then does what it always did)."""
    given = given_options(words)
    if given is None:
        return None
    strings = {
        key: str(given[key]) if key in given else environ.get(env) or None for key, env in ENVIRONMENT.items()
    }
    head, gcs = strings["head"], given.get("gcs")
    dashboard = str(given["dashboard"]) if given.get("dashboard") else None
    if not _one_source(given, head, environ):
        return None
    fmt = str(given.get(names.FORMAT.key, "json" if given.get("json_out") else "text"))
    if fmt not in FORMATS["text" if head else "gcs"] or (given.get("json_out") and fmt != "json"):
        return None
    try:
        timeout_s = float(given.get("timeout", DEFAULT_TIMEOUT_S))
        head, gcs = _checked(head, str(gcs) if gcs else None)
    except ValueError:
        return None
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        return None
    tls = None
    if head:
        from rayscope.net.tls import TlsFiles

        tls = TlsFiles(strings["tls_cert"], strings["tls_key"], strings["tls_ca"])
    return Request(
        head=head,
        gcs=gcs,
        token_file=strings["token_file"],
        timeout_s=timeout_s,
        all_nodes=bool(given.get("all_nodes")),
        gpus=bool(given.get("gpus")),
        fmt=fmt,
        tls=tls,
        verbose=verbose,
        dashboard=dashboard,
    )


def _one_source(
    given: Mapping[str, Union[str, bool]], head: Optional[str], environ: Mapping[str, str]
) -> bool:
    """Whether the options read one source as the CLI takes them: a head, with no option of
    the GCS read; else the GCS, with no option of a head read and a dashboard the source
    takes."""
    if head:
        return not any(key in given for key in (*GCS_ONLY, "gcs"))
    if any(key in given for key in HEAD_ONLY):
        return False
    dashboard = given.get("dashboard")
    return _dashboard_taken(str(dashboard) if dashboard else None, environ)


def _dashboard_taken(option: Optional[str], environ: Mapping[str, str]) -> bool:
    """Whether ``--dashboard`` and ``$RAYSCOPE_DASHBOARD`` are values the source takes (a
    bad one is the CLI's to say); neither given: nothing to check, nothing imported."""
    if not (option or environ.get(DASHBOARD_ENV)):
        return True
    from rayscope.sources.dashboard import choose_address

    try:
        choose_address(option, environ, None, "")
    except ValueError:
        return False
    return True


def _checked(head: Optional[str], gcs: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """``--head`` and ``--gcs`` as the CLI's option callbacks give them; ``ValueError``."""
    if head:
        from rayscope.client import request as head_request

        return head_request.parse_head_url(head), None
    if gcs:
        from rayscope.net.addresses import parse_gcs_address

        return None, parse_gcs_address(gcs)
    return None, None


def answer_from_gcs(request: Request) -> int:
    """``status`` without a head agent, as the CLI's ``status`` does it (the read, the
    output, ``--verbose``'s sources), without the CLI's imports."""
    from rayscope.cli import output
    from rayscope.client import head as client

    result = client.read_cluster(
        None, None, request.gcs, request.timeout_s, request.gpus, None, request.dashboard
    )
    code = output.deliver_status(result, request.fmt, request.all_nodes, request.gpus)
    if request.verbose:
        from rayscope.render.status import source_details

        sys.stderr.write("\n".join(source_details(result.sources)) + "\n")
    return code


class Said(NamedTuple):
    """What the head's headers say ``status`` does besides printing the body."""

    code: int
    note: str
    sources: list[str]


def answer_from_head(request: Request) -> Optional[int]:
    """Print the head's answer to ``request`` as ``status`` prints it; its exit code, or
    ``None`` when the answer is not one this module takes (nothing printed)."""
    from rayscope.client import request as head_request
    from rayscope.errors import EXIT_NO_DATA, AgentError
    from rayscope.net import deadline as deadlines
    from rayscope.net import tokens
    from rayscope.net.tls import NO_TLS

    assert request.head is not None
    tls = request.tls or NO_TLS
    json_out = request.fmt == "json"
    token = tokens.read_token(request.token_file)
    query = ["indent=1"] if json_out else ["format=lines"]
    query += ["gpus=1"] if request.gpus else []
    query += ["all=1"] if request.all_nodes else []
    deadline = deadlines.Deadline(request.timeout_s)
    copied: list[Said] = []
    sink = _json_copy(request, copied) if json_out else None
    target = "/v1/status?" + "&".join(query)
    got = head_request.get(request.head, target, token, request.timeout_s, tls, deadline, sink)
    if copied:  # printed as it came
        return _said(copied[0], request.verbose)
    # What this module does not print itself, the CLI asks again: within the same deadline.
    deadlines.carry(request.head, deadline)
    if got.status != 200:  # the CLI's path says what the refusal means
        return None
    kind = "application/json" if json_out else "text/plain"
    said = status_headers(got.headers, request.verbose)
    if said is None or not got.headers.get("content-type", "").startswith(kind):
        return None
    if said.code == EXIT_NO_DATA:
        raise AgentError(said.note or "no data", EXIT_NO_DATA)
    text = _json_text(got.body, got.headers) if json_out else _lines_text(got.body)
    if text is None:
        return None
    deadlines.forget_carried()
    from rayscope.cli.output import to_stdout

    to_stdout(text)
    return _said(said, request.verbose)


def _said(said: "Said", verbose: bool) -> int:
    """After the body: the note and (``--verbose``) the sources on stderr; the exit code."""
    from rayscope.errors import say

    if said.note:
        say(said.note)
    if verbose:
        sys.stderr.write("\n".join(said.sources) + "\n")
    return said.code


def _json_copy(request: Request, copied: "list[Said]") -> "Sink":
    """The head's indented document (``X-Rayscope-Indent``) to stdout as it comes, each part
    checked first (:class:`rayscope.cli.terminal_copy.TerminalCopy`), its :class:`Said` into
    ``copied``; any other answer is read whole, as before (79 MB at 10,000 nodes: held whole,
    then indented, it cost 35 MB)."""
    from rayscope.errors import EXIT_NO_DATA, AgentError

    def sink(status: int, headers: dict[str, str]) -> "Optional[Writer]":
        utf8 = (sys.stdout.encoding or "").lower().replace("-", "") == "utf8"
        indented = headers.get(HEADER_INDENT.lower()) == "2"
        if status != 200 or not indented or not utf8:
            return None
        said = status_headers(headers, request.verbose)
        if said is None or not headers.get("content-type", "").startswith("application/json"):
            return None
        if said.code == EXIT_NO_DATA:
            raise AgentError(said.note or "no data", EXIT_NO_DATA)
        copied.append(said)
        sys.stdout.flush()
        return TerminalCopy(f"head agent at {request.head} answered a document with terminal escapes")

    return sink


def status_headers(headers: dict[str, str], verbose: bool) -> Optional[Said]:
    """``X-Rayscope-Exit``, ``-Note`` and (for ``--verbose``) ``-Notes`` of an answer of
    this document schema; ``None`` when one is missing or malformed."""
    from rayscope.schema import DOCUMENT_SCHEMA

    if headers.get(HEADER_SCHEMA.lower()) != str(DOCUMENT_SCHEMA):
        return None
    code, note = headers.get(HEADER_EXIT.lower()), headers.get(HEADER_NOTE.lower())
    if code not in ("0", "1", "2") or note is None:
        return None
    try:
        said = Said(int(code), "" if note == '""' else _json_loads(note), [])
        if verbose:
            said = said._replace(sources=_json_loads(headers.get(HEADER_NOTES.lower(), "")))
    except ValueError:
        return None
    if not isinstance(said.note, str) or not all(isinstance(s, str) for s in said.sources):
        return None
    from rayscope.labels import printable_lines

    return said._replace(sources=printable_lines(said.sources)) if verbose else said


def _json_loads(text: str) -> Any:
    """A header's JSON, its nesting bounded (:mod:`rayscope.net.peer_json`: ``PeerJsonError``
    is a ``ValueError``); imported only for a note or ``--verbose``: most answers have neither."""
    from rayscope.net import peer_json

    return peer_json.decode(text)


def _lines_text(body: Union[bytes, bytearray]) -> str:
    """The status lines as served, through the one printable rule again (the head's lines
    are printable already; the wire between is not to be trusted with a terminal)."""
    from rayscope.labels import printable_lines

    return "\n".join(printable_lines(body.decode("utf-8", "replace").split("\n")))


def _json_text(body: Union[bytes, bytearray], headers: dict[str, str]) -> Optional[bytes]:
    """The document as ``status --json`` prints it; ``None`` when it is not JSON. Indented by
    the head (``X-Rayscope-Indent``) unless it escapes a terminal; compact (an older head),
    indented here by ``msgspec.json.format`` (the CLI's own decode and encode give the same)."""
    if headers.get(HEADER_INDENT.lower()) == "2":
        return None if escapes_a_terminal(body) else bytes(body)
    import msgspec

    from rayscope.net import peer_json

    try:
        peer_json.check_depth(body)  # msgspec's format recurses as its decoder does
        return msgspec.json.format(body, indent=2) + b"\n"
    except (ValueError, msgspec.DecodeError, RecursionError):  # PeerJsonError, bad UTF-8
        return None
