"""Where ``status`` goes: ``--json``, ``--format`` and ``--output``'s suffix settled as one
format, the document written to its file (:mod:`rayscope.sinks.files`) or printed, and the
exit code its completeness gives."""

import os
import sys
from typing import TYPE_CHECKING, Optional, Union

from rayscope.errors import EXIT_NO_DATA, EXIT_USAGE, AgentError, say
from rayscope.sinks.files import append_line, write_atomic

if TYPE_CHECKING:
    from rayscope.schema.status import ClusterStatus

FORMATS = ("text", "json", "prom")


FORMAT_OF_SUFFIX = {".json": "json", ".prom": "prom"}
"""What ``--output FILE`` holds when no format is asked for: a ``.json`` file JSON, a ``.prom``
file node_exporter's text format (which its textfile collector reads), anything else lines."""


def status_format(json_out: bool, format_: Optional[str], output_file: Optional[str] = None) -> str:
    """``--json``, ``--format`` and ``--output FILE``'s suffix as one choice: a conflict is a
    usage error (exit 2), so no text ever lands in a ``.json`` or JSON in a ``.prom``."""
    if json_out and format_ not in (None, "json"):
        raise AgentError(f"--json and --format {format_} ask for different outputs", EXIT_USAGE)
    asked = "json" if json_out else format_
    suffix = os.path.splitext(output_file or "")[1].lower()
    implied = FORMAT_OF_SUFFIX.get(suffix)
    if asked and implied and asked != implied:
        raise AgentError(
            f"--output {output_file} names a {suffix} file, but the format asked for is {asked}:"
            f" drop {'--json' if json_out else '--format ' + asked} or name another file",
            EXIT_USAGE,
        )
    return asked or implied or "text"


def deliver_status(
    result: "ClusterStatus",
    fmt: str,
    include_dead: bool = False,
    gpus: bool = False,
    output_file: Optional[str] = None,
    append_file: Optional[str] = None,
) -> int:
    """Print or write ``result`` as asked; the exit code its completeness gives (0, 1).

    Never an empty document over a good one: with no data nothing is written and
    :class:`AgentError` (exit 2) says why. The completeness note goes to stderr.
    """
    from rayscope.core.completeness import assess
    from rayscope.render.status import status_ndjson

    code, note = assess(result)
    if code == EXIT_NO_DATA:
        raise AgentError(note or "no data", code)
    from rayscope.render.status import render_status

    text = render_status(result, fmt, include_dead, gpus)
    if output_file:
        write_atomic(output_file, text)
    if append_file:
        append_line(append_file, status_ndjson(result, include_dead=include_dead))
    if not output_file and not append_file:
        to_stdout(text)
    if note:
        say(note)
    return code


def to_stdout(text: Union[str, bytes]) -> None:
    """``text`` on stdout (``bytes``: UTF-8 already, written as they are when stdout's
    encoding is UTF-8, so that a large document is not decoded to be encoded again); a
    reader that went away (``status | head -1``) is not an error: the rest is dropped
    quietly and the command keeps the exit code it would have had."""
    try:
        if isinstance(text, bytes) and (sys.stdout.encoding or "").lower().replace("-", "") == "utf8":
            sys.stdout.flush()
            sys.stdout.buffer.write(text)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(text.decode() if isinstance(text, bytes) else text)
            sys.stdout.flush()
    except BrokenPipeError:
        # The interpreter flushes stdout again at exit: point it at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
