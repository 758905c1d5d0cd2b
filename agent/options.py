"""The command line's shared options and the checks they get at parse time.

Every command's options that more than one command takes are declared here once (typer's
``Annotated`` types), with the callback that checks the value before any work starts: a bad
value is a usage error (exit 2) naming the option, never a traceback or a late failure.
:func:`seconds` is the one check of every duration (finite, in range, in seconds).

Light on purpose: ``status --head``, the fast path, pays for every import made here.
"""

import inspect
import math
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Annotated, Optional

import click
import typer

from agent import client
from agent.addresses import GCS_ADDRESS_ENV, parse_address

WATCH_DEFAULT_S = 2.0
MAX_SECONDS = 86_400.0
"""The longest duration an option takes (a day): larger is a typo, and ``inf`` would
overflow the timers it feeds."""


def checked_seconds(value: float, name: str = "a duration") -> float:
    """``value`` seconds if finite and in (0, a day]; ``ValueError`` naming what is wrong."""
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a number of seconds")
    if not 0 < value <= MAX_SECONDS:
        raise ValueError(f"must be more than 0 and at most {MAX_SECONDS:g} seconds, not {value:g}")
    return value


def seconds(value: float) -> float:
    """A typer callback: :func:`checked_seconds` as a usage error."""
    try:
        return checked_seconds(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def seconds_or_none(value: Optional[float]) -> Optional[float]:
    return None if value is None else seconds(value)


def _gcs_option(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    try:
        return parse_address(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def endpoint(default_port: int) -> Callable[[str], str]:
    """A callback for ``HOST[:PORT]``: the port defaults to ``default_port``."""

    def check(value: str) -> str:
        text = value if ":" in value else f"{value}:{default_port}"
        try:
            return parse_address(text)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None

    return check


def _head_url(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    try:
        return client.parse_head_url(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


GcsOption = Annotated[
    Optional[str],
    typer.Option(
        "--gcs",
        metavar="HOST:PORT",
        callback=_gcs_option,
        help=(
            f"GCS address of the cluster. Default: ${GCS_ADDRESS_ENV}, else the local raylet's,"
            " else <ray temp dir>/ray_current_cluster."
        ),
    ),
]
TimeoutOption = Annotated[
    float,
    typer.Option("--timeout", metavar="SECONDS", callback=seconds, help="Deadline for the GCS read."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="One JSON document instead of lines.")]
TokenFileOption = Annotated[
    Optional[str],
    typer.Option(
        "--token-file",
        metavar="FILE",
        envvar="RAYSCOPE_TOKEN_FILE",
        help="Shared secret of the head and its agents (the same file everywhere).",
    ),
]
TlsCertOption = Annotated[
    Optional[str],
    typer.Option(
        "--tls-cert",
        metavar="PEM",
        envvar="RAYSCOPE_TLS_CERT",
        help="TLS certificate (the head's; an agent's or client's for mutual TLS).",
    ),
]
TlsKeyOption = Annotated[
    Optional[str],
    typer.Option("--tls-key", metavar="PEM", envvar="RAYSCOPE_TLS_KEY", help="The --tls-cert's private key."),
]
TlsCaOption = Annotated[
    Optional[str],
    typer.Option(
        "--tls-ca",
        metavar="PEM",
        envvar="RAYSCOPE_TLS_CA",
        help="CA that signed the head's certificate (on the head: its clients', then required).",
    ),
]
IntervalOption = Annotated[
    float, typer.Option("--interval", metavar="SECONDS", callback=seconds, help="Seconds between reports.")
]
GpusOption = Annotated[
    bool,
    typer.Option(
        "--gpus",
        help=(
            "Per GPU: the actors on it, what each booked (VRAM_MB, GPU) beside what it uses"
            " (NVML), and memory held by processes that booked nothing."
        ),
    ),
]
HeadOption = Annotated[
    Optional[str],
    typer.Option(
        "--head",
        metavar="URL",
        envvar=client.HEAD_ENV,
        callback=_head_url,
        help="Read a head agent (http://HOST:7532) instead of the GCS: every node's NVML.",
    ),
]


class Format(str, Enum):
    text = "text"
    json = "json"
    prom = "prom"


class Sizing(str, Enum):
    auto = "auto"
    vram = "vram"
    fraction = "fraction"


FormatOption = Annotated[
    Optional[Format],
    typer.Option(
        "--format",
        help="text (the default), json (= --json), or prom: node_exporter textfile format.",
    ),
]

OutputFileOption = Annotated[
    Optional[str],
    typer.Option(
        "--output",
        metavar="FILE",
        help=(
            "Write to FILE instead of stdout, atomically (temp file in FILE's directory,"
            " fsync, rename): a reader never sees half a file. Nothing is written when the"
            " cluster cannot be read."
        ),
    ),
]

AppendFileOption = Annotated[
    Optional[str],
    typer.Option(
        "--append",
        metavar="FILE",
        help="Append one JSON document per line (NDJSON) with a timestamp to FILE.",
    ),
]

WatchOption = Annotated[
    Optional[float],
    typer.Option(
        "--watch",
        metavar="[SECONDS]",
        callback=seconds_or_none,
        help=(
            f"Redraw in place every SECONDS (default {WATCH_DEFAULT_S:g}), values that"
            " changed since the last frame highlighted; Ctrl-C ends it."
        ),
    ),
]

GpuMemoryOption = Annotated[
    Optional[int],
    typer.Option(
        "--gpu-memory-mb",
        metavar="MB",
        help="GPU memory per replica, as a BioEngine app declares it; -1 = a whole GPU.",
    ),
]

NumCpusOption = Annotated[
    float,
    typer.Option(
        "--num-cpus",
        min=0,
        help=(
            "CPUs each replica books (Ray's num_cpus). 0 = as declared;"
            " a Ray Serve replica books 1 by default."
        ),
    ),
]

MemoryMbOption = Annotated[
    float, typer.Option("--memory-mb", min=0, help="Ray memory each replica books, in MB.")
]

ShapeOption = Annotated[
    Optional[str],
    typer.Option(
        "--shape",
        metavar="JSON",
        help=(
            "A raw Ray resource shape per replica instead of --gpu-memory-mb:"
            ' \'{"GPU": 0.5, "CPU": 1}\' (Ray\'s names; memory in bytes).'
        ),
    ),
]

GpuTotalOption = Annotated[
    Optional[float],
    typer.Option(
        "--gpu-total-mb",
        metavar="MB",
        min=1,
        help=(
            "Size of the smallest GPU for the fraction path. Default: NVML's measurement,"
            " else a node's VRAM_MB total per GPU; without either the answer is 'could not tell'."
        ),
    ),
]

SizingOption = Annotated[
    Sizing,
    typer.Option(
        "--sizing",
        help=(
            "How --gpu-memory-mb is booked: auto = BioEngine's rule (VRAM_MB where a node"
            " advertises it, else a GPU fraction), vram, or fraction."
        ),
    ),
]

ListenOption = Annotated[
    str,
    typer.Option("--listen", metavar="HOST:PORT", callback=endpoint(7531), help="Where node agents connect."),
]

HttpOption = Annotated[
    str,
    typer.Option(
        "--http",
        metavar="HOST:PORT",
        callback=endpoint(7532),
        help="GET /v1/status, /v1/usage, /metrics, /healthz.",
    ),
]

ReadTokenFileOption = Annotated[
    Optional[str],
    typer.Option(
        "--read-token-file",
        metavar="FILE",
        envvar="RAYSCOPE_READ_TOKEN_FILE",
        help=(
            "A read-only token: GET /v1/status and /metrics only (dashboards, status --head),"
            " never accepted for reports. Must differ from --token-file."
        ),
    ),
]

MaxPendingOption = Annotated[
    int,
    typer.Option(
        "--max-pending", metavar="N", help="Connections per source address before their first good frame."
    ),
]

AgentsOption = Annotated[
    str,
    typer.Option(
        "--agents",
        metavar="none|ray",
        click_type=click.Choice(["none", "ray"]),
        help="ray: keep a node agent on every alive node, placed through Ray (removed at shutdown).",
    ),
]

RemoveOption = Annotated[
    bool,
    typer.Option("--remove", help="With --agents ray: remove every agent placed through Ray, then exit."),
]

PushHeadOption = Annotated[
    str,
    typer.Option(
        "--head",
        metavar="HOST:PORT",
        callback=endpoint(7531),
        help="The head agent's report port (7531).",
    ),
]

NodeIdOption = Annotated[
    Optional[str],
    typer.Option("--node-id", metavar="ID", help="The Ray node to report for (default: the local raylet's)."),
]

AllNodesOption = Annotated[
    bool,
    typer.Option(
        "--all",
        help="Every node: dead ones too, and on a cluster of more than 50 nodes the ones with"
        " nothing to flag, which the status lines otherwise count in one line.",
    ),
]


def optional_watch_value(argv: Sequence[str]) -> list[str]:
    """``--watch`` alone means every 2 s. Click options take a value or none, not either
    (and typer drops click's ``flag_value``), so a bare ``--watch`` gets the default here."""
    args = list(argv)
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--":
            return out + args[i + 1 :]
        if arg == "--watch":
            following = args[i + 1] if i + 1 < len(args) else ""
            try:
                float(following)
            except ValueError:
                out.append(f"{WATCH_DEFAULT_S:g}")
    return out


def reflow(doc: str, **values: object) -> str:
    """A docstring as help text: paragraphs kept, the source's line breaks inside them
    dropped, so the terminal wraps each paragraph once, at its own width. ``{name}`` in the
    docstring is replaced by ``values[name]`` (a constant's value, never its copy)."""
    text = inspect.cleandoc(doc)
    for name, value in values.items():
        text = text.replace("{" + name + "}", str(value))
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))
