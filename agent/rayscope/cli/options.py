"""The command line's shared options and the checks they get at parse time.

Every command's options that more than one command takes are declared here once (typer's
``Annotated`` types), with the callback that checks the value before any work starts: a bad
value is a usage error (exit 2) naming the option, never a traceback or a late failure.
:func:`within` is the one check of every number (finite, in range, its unit in the message:
the ranges are :mod:`rayscope.core.limits`); ``--head`` and ``--gcs`` together are refused here too.
Light on purpose: the CLI's start pays for every import here; the daemons' are in daemon_options.
"""

import inspect
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Optional, Union

import typer

from rayscope.cli import names
from rayscope.cli.typer_click import OptionError, from_command_line, from_environment
from rayscope.client import head as client
from rayscope.core import limits
from rayscope.core.limits import Limit, Number
from rayscope.defaults import DASHBOARD_ENV, DEFAULT_HTTP_PORT, GCS_ADDRESS_ENV, HEAD_ENV
from rayscope.net.addresses import parse_address, parse_gcs_address, with_port

WATCH_DEFAULT_S = 2.0


def within(limit: Limit) -> Callable[..., Any]:
    """The callback of a numeric option: its text read and checked by
    :func:`rayscope.core.limits.parse` (a default, already a number, by ``check``), a refusal
    as a usage error. The option's ``parser`` is :func:`as_given`, so that click's own
    conversion ("'4GB' is not a valid integer") never answers first."""

    def check(param: typer.CallbackParam, value: Union[str, Number, None]) -> Optional[Number]:
        if value is None:
            return None
        try:
            if isinstance(value, str):
                return limits.parse(param.opts[0], value, limit)
            return limits.check(param.opts[0], value, limit)
        except ValueError as err:
            raise OptionError(str(err)) from None

    return check


def as_given(text: str) -> str:
    """A numeric option's parser: the text as given, for :func:`within` to read."""
    return text


def _parsed(value: Optional[str], parse: Callable[[str], str]) -> Optional[str]:
    """``parse(value)``, its ``ValueError`` a usage error (``None`` stays ``None``)."""
    try:
        return None if value is None else parse(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def endpoint(default_port: int, any_port: bool = False) -> Callable[[Optional[str]], Optional[str]]:
    """A callback for ``HOST[:PORT]``: the port defaults to ``default_port``; ``any_port``:
    an address to listen on (port 0: the OS picks one)."""
    return lambda value: _parsed(value, lambda text: parse_address(with_port(text, default_port), any_port))


def _one_source(ctx: typer.Context, given: str) -> None:
    """``--head`` and ``--gcs`` name two sources: refused, whichever is checked second."""
    other = "gcs" if given == "head" else "head"
    if ctx.params.get(other) is None:
        return
    if from_environment(ctx, "head"):
        raise OptionError(f"--gcs with ${HEAD_ENV} set: two sources, drop --gcs or unset {HEAD_ENV}")
    raise OptionError("--head with --gcs: two sources, give one (--head reads a head agent, --gcs the GCS)")


def _unused_token_file(ctx: typer.Context, token_file: Optional[str]) -> None:
    """``--token-file`` typed where a command that could read a head reads the GCS: refused,
    not ignored (the GCS read takes Ray's own token). Checked when both ``--head`` and
    ``--token-file`` are known, whichever is checked second; ``$RAYSCOPE_TOKEN_FILE`` set
    for the agents is no mistake of this command."""
    if token_file is None or "head" not in ctx.params or ctx.params["head"] is not None:
        return
    if "gcs" not in {p.name for p in ctx.command.params}:
        return  # usage: it needs a head and says so
    if not from_command_line(ctx, "token_file"):
        return
    raise OptionError(
        "--token-file without --head: the token is a head agent's, and the GCS read takes Ray's own"
        " ($RAY_AUTH_TOKEN_PATH): drop --token-file, or read a head with --head URL"
    )


def _token_file(ctx: typer.Context, value: Optional[str]) -> Optional[str]:
    _unused_token_file(ctx, value)
    return value


def _gcs_option(ctx: typer.Context, value: Optional[str]) -> Optional[str]:
    address = _parsed(value, parse_gcs_address)
    if address is not None:
        _one_source(ctx, "gcs")
    return address


def _head_url(ctx: typer.Context, value: Optional[str]) -> Optional[str]:
    if value is None:
        ctx.params["head"] = None  # known to be none now, as click records it after this
        _unused_token_file(ctx, ctx.params.get("token_file"))
        return None
    try:
        url = client.parse_head_url(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    _one_source(ctx, "head")
    return url


GcsOption = Annotated[
    Optional[str],
    typer.Option(
        *names.GCS.flags,
        metavar="HOST:PORT",
        callback=_gcs_option,
        help=(
            f"GCS address of the cluster. Default: ${GCS_ADDRESS_ENV}, else $RAY_ADDRESS (as"
            " ray.init() reads it), else the local raylet's, else <ray temp dir>/ray_current_cluster."
        ),
    ),
]
TimeoutOption = Annotated[
    float,
    typer.Option(
        *names.TIMEOUT.flags,
        metavar="SECONDS",
        callback=within(limits.SECONDS),
        parser=as_given,
        help="Deadline for the GCS read.",
    ),
]
JsonOption = Annotated[bool, typer.Option(*names.JSON.flags, help="One JSON document instead of lines.")]
TokenFileOption = Annotated[
    Optional[str],
    typer.Option(
        *names.TOKEN_FILE.flags,
        metavar="FILE",
        envvar=names.TOKEN_FILE.env,
        callback=_token_file,
        help="Shared secret of the head and its agents (the same file everywhere).",
    ),
]
TlsCertOption = Annotated[
    Optional[str],
    typer.Option(
        *names.TLS_CERT.flags,
        metavar="PEM",
        envvar=names.TLS_CERT.env,
        help="TLS certificate (the head's; an agent's or client's for mutual TLS).",
    ),
]
TlsKeyOption = Annotated[
    Optional[str],
    typer.Option(
        *names.TLS_KEY.flags, metavar="PEM", envvar=names.TLS_KEY.env, help="The --tls-cert's private key."
    ),
]
TlsCaOption = Annotated[
    Optional[str],
    typer.Option(
        *names.TLS_CA.flags,
        metavar="PEM",
        envvar=names.TLS_CA.env,
        help="CA that signed the head's certificate (on the head: its clients', then required).",
    ),
]
IntervalOption = Annotated[
    float,
    typer.Option(
        "--interval",
        metavar="SECONDS",
        callback=within(limits.SECONDS),
        parser=as_given,
        help="Seconds between reports.",
    ),
]
GpusOption = Annotated[
    bool,
    typer.Option(
        *names.GPUS.flags,
        help=(
            "Per GPU: the actors on it, what each booked (VRAM_MB, GPU) beside what it uses"
            " (NVML), and memory held by processes that booked nothing."
        ),
    ),
]


def _dashboard(value: Optional[str]) -> Optional[str]:
    """``--dashboard``: ``none``, or a URL the dashboard source takes (checked now, read later)."""
    if value is None or value.strip().lower() == "none":
        return value
    from rayscope.sources.dashboard import parse_url

    try:
        parse_url(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    return value


DashboardOption = Annotated[
    Optional[str],
    typer.Option(
        *names.DASHBOARD.flags,
        metavar="URL|none",
        callback=_dashboard,
        help=(
            f"Ray's dashboard (http://HOST:8265), read for the GPU memory of every node no agent"
            f" measured; none: not read. Default: ${DASHBOARD_ENV}, else the address the cluster"
            " published in its GCS."
        ),
    ),
]
HeadOption = Annotated[
    Optional[str],
    typer.Option(
        *names.HEAD.flags,
        metavar="URL",
        envvar=names.HEAD.env,
        callback=_head_url,
        help=f"Read a head agent (http://HOST:{DEFAULT_HTTP_PORT}) instead of the GCS: every node's NVML.",
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
        *names.FORMAT.flags,
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
        callback=within(limits.SECONDS),
        parser=as_given,
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
        callback=within(limits.GPU_MEMORY_MB),
        parser=as_given,
        help="GPU memory per replica in MB, as a BioEngine app declares it (4 GB = 4096); -1 = a whole GPU.",
    ),
]

NumCpusOption = Annotated[
    float,
    typer.Option(
        "--num-cpus",
        metavar="CPUS",
        callback=within(limits.CPUS),
        parser=as_given,
        help=(
            "CPUs each replica books (Ray's num_cpus). 0 = as declared;"
            " a Ray Serve replica books 1 by default."
        ),
    ),
]

MemoryMbOption = Annotated[
    float,
    typer.Option(
        "--memory-mb",
        metavar="MB",
        callback=within(limits.MEBIBYTES),
        parser=as_given,
        help="Ray memory each replica books, in MB.",
    ),
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
        callback=within(limits.GPU_MEBIBYTES),
        parser=as_given,
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

ReplicasOption = Annotated[
    int,
    typer.Option(
        "--replicas",
        metavar="N",
        callback=within(limits.REPLICAS),
        parser=as_given,
        help="How many replicas to place.",
    ),
]

AllNodesOption = Annotated[
    bool,
    typer.Option(
        *names.ALL_NODES.flags,
        help="Every node: dead ones too, and on a cluster of more than 50 nodes the ones with"
        " nothing to flag, which the status lines otherwise count in one line.",
    ),
]


def reflow(doc: str, **values: object) -> str:
    """A docstring as help text: paragraphs kept, the source's line breaks inside them
    dropped, so the terminal wraps each paragraph once, at its own width. ``{name}`` in the
    docstring is replaced by ``values[name]`` (a constant's value, never its copy)."""
    text = inspect.cleandoc(doc)
    for name, value in values.items():
        text = text.replace("{" + name + "}", str(value))
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))
