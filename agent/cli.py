"""The ``rayscope`` command: typer commands only; the work is done by the modules they call.

Errors are one line on stderr and a non-zero exit code, never a traceback (``--verbose``
shows one). Exit codes: 0 = answered, 1 = failed, 2 = no data (the cluster could not be
read) or bad usage.
"""

import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Annotated, Optional

import click
import typer

# Deliberately not agent.collect here: it pulls psutil and pynvml, which `status --head`
# (the fast path, benchmarked against `ray status`) does not need; the commands and options
# that need collect, fit, output, watch, json or traceback import them where they are used.
from agent import SUPPORTED_PYTHON, SUPPORTED_RAY, __version__, client, completeness
from agent.addresses import DEFAULT_TIMEOUT_S, GCS_ADDRESS_ENV, parse_address, split_address
from agent.errors import EXIT_FAILED, EXIT_NO_DATA, AgentError
from agent.render.fit import fit_json, fit_lines
from agent.render.gpus import status_gpu_lines
from agent.render.metrics import metrics_text
from agent.render.node import node_json, node_lines
from agent.render.status import source_details, status_json, status_lines, status_ndjson
from agent.schema.fit import FitRequest
from agent.schema.report import SourceStatus
from agent.schema.status import ClusterStatus
from agent.tls import TlsFiles
from agent.validate import printable

app = typer.Typer(
    name="rayscope",
    help=(
        "Booked vs measured GPU state of a Ray cluster. Shows, per node and for the"
        " cluster, the three GPU numbers that differ: device handles (Ray's GPU"
        " fraction), booked VRAM (the VRAM_MB resource, in MiB) and measured VRAM (NVML)."
        f" Tested with Ray {SUPPORTED_RAY[0]} to {SUPPORTED_RAY[1]} and Python"
        f" {SUPPORTED_PYTHON[0]} to {SUPPORTED_PYTHON[1]}."
    ),
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_verbose = False


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rayscope {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show tracebacks and which sources answered.")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    global _verbose
    _verbose = verbose


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """AgentError → ``rayscope: <message>`` and its exit code; anything else → exit 1."""
    try:
        yield
    except AgentError as err:
        if _verbose:
            import traceback

            traceback.print_exc()
        typer.echo(f"rayscope: {printable(str(err))}", err=True)
        raise typer.Exit(err.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as err:  # a bug of ours: still one line unless asked for more
        if _verbose:
            import traceback

            traceback.print_exc()
        reason = printable(f"{type(err).__name__}: {err}")
        typer.echo(f"rayscope: internal error: {reason} (--verbose shows where)", err=True)
        raise typer.Exit(1) from None


def _gcs_option(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    try:
        return parse_address(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def _positive(value: float) -> float:
    if value <= 0:
        raise typer.BadParameter("must be more than 0 seconds")
    return value


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
    typer.Option("--timeout", metavar="SECONDS", callback=_positive, help="Deadline for the GCS read."),
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
    float, typer.Option("--interval", metavar="SECONDS", callback=_positive, help="Seconds between reports.")
]


def _head_url(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    try:
        return client.parse_head_url(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def _endpoint(default_port: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        text = value if ":" in value else f"{value}:{default_port}"
        try:
            return parse_address(text)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None

    return check


def _token(path: Optional[str]) -> bytes:
    if path is None:
        return b""
    from agent import tokens

    try:
        return tokens.read_token_file(path)
    except ValueError as err:
        raise AgentError(str(err), EXIT_NO_DATA) from None


def _daemon_logging() -> None:
    import logging

    logging.basicConfig(
        level=logging.DEBUG if _verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


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


def _read_cluster(
    head: Optional[str],
    token_file: Optional[str],
    gcs: Optional[str],
    timeout: float,
    gpus: bool = False,
    tls: Optional[TlsFiles] = None,
) -> ClusterStatus:
    """The cluster as ``status`` (every mode) and ``fit`` read it, the one place that picks
    the source: a head agent (--head / $RAYSCOPE_HEAD), else the embedded default. ``tls``:
    the --tls-* files (None: from $RAYSCOPE_TLS_*)."""
    if head:
        files = TlsFiles.from_env() if tls is None else tls
        return client.head_status(head, _token(token_file), timeout, gpus=gpus, tls=files)
    from agent import collect

    return collect.embedded_status(gcs, timeout, gpus=gpus)


def _print(lines: list[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")


def _print_sources(sources: list[SourceStatus]) -> None:
    """With ``--verbose``: which sources answered, and through what (the GCS read names the
    interpreter it ran under), on stderr so that ``--json`` output stays one document."""
    if _verbose:
        sys.stderr.write("\n".join(source_details(sources)) + "\n")


class Format(str, Enum):
    text = "text"
    json = "json"
    prom = "prom"


class Sizing(str, Enum):
    auto = "auto"
    vram = "vram"
    fraction = "fraction"


WATCH_DEFAULT_S = 2.0


def _positive_or_none(value: Optional[float]) -> Optional[float]:
    return None if value is None else _positive(value)


def _status_format(json_out: bool, format_: Optional[Format]) -> Format:
    if json_out and format_ not in (None, Format.json):
        raise click.UsageError(f"--json and --format {format_.value} ask for different outputs")
    return Format.json if json_out else (format_ or Format.text)


def _status_lines(result: ClusterStatus, include_dead: bool, gpus: bool) -> list[str]:
    lines = status_lines(result, include_dead=include_dead)
    return lines + status_gpu_lines(result, include_dead=include_dead) if gpus else lines


def _render_status(result: ClusterStatus, fmt: Format, include_dead: bool, gpus: bool) -> str:
    if fmt is Format.json:
        return status_json(result, include_dead=include_dead) + "\n"
    if fmt is Format.prom:
        return metrics_text(result)
    return "\n".join(_status_lines(result, include_dead, gpus)) + "\n"


@app.command()
def status(
    json_out: JsonOption = False,
    all_nodes: Annotated[bool, typer.Option("--all", help="Show dead nodes too.")] = False,
    head: HeadOption = None,
    gcs: GcsOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    gpus: GpusOption = False,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
    format_: Annotated[
        Optional[Format],
        typer.Option(
            "--format",
            help="text (the default), json (= --json), or prom: node_exporter textfile format.",
        ),
    ] = None,
    output_file: Annotated[
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
    ] = None,
    append_file: Annotated[
        Optional[str],
        typer.Option(
            "--append",
            metavar="FILE",
            help="Append one JSON document per line (NDJSON) with a timestamp to FILE.",
        ),
    ] = None,
    watch_s: Annotated[
        Optional[float],
        typer.Option(
            "--watch",
            metavar="[SECONDS]",
            callback=_positive_or_none,
            help=(
                f"Redraw in place every SECONDS (default {WATCH_DEFAULT_S:g}), values that"
                " changed since the last frame highlighted; Ctrl-C ends it."
            ),
        ),
    ] = None,
) -> None:
    """Cluster status: GPU and VRAM_MB booked, VRAM measured, per node.

    Per node and summed for the cluster: the GPU fraction booked, the VRAM_MB booked and
    the GPU memory NVML measures. With --head (or $RAYSCOPE_HEAD) it asks a head agent,
    which merges every node agent's NVML with the scheduler's view. Without, it reads the
    scheduler's view of every node from the GCS (no ray.init, no job) and NVML on this
    host only. The JSON's "view" says which.

    Exit 0: complete. Exit 1: partial (the report of a node whose agent was reporting is
    stale, or the scheduler's view is older than 3 intervals, or missing while agents
    report). Exit 2: no data (head
    or GCS unreachable, no address) or bad usage. Exit 3: the --output or --append FILE
    could not be written. Nodes that run no agent are not partial data.
    """
    fmt = _status_format(json_out, format_)
    tls = TlsFiles(tls_cert, tls_key, tls_ca)
    if watch_s is not None:
        if fmt is not Format.text or output_file or append_file:
            raise click.UsageError(
                "--watch draws on the terminal: it takes no --json, --format, --output or --append"
            )
        if not sys.stdout.isatty():
            raise click.UsageError("--watch needs a terminal on stdout (for files, use --output or --append)")
        with _one_line_errors():
            from agent import watch

            code = watch.run(
                lambda: _read_cluster(head, token_file, gcs, timeout, gpus, tls),
                lambda result: _status_lines(result, all_nodes, gpus),
                watch_s,
                keyboard_fd=sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else None,
            )
        raise typer.Exit(code)
    with _one_line_errors():
        result = _read_cluster(head, token_file, gcs, timeout, gpus, tls)
        code, note = completeness.assess(result)
        if code == EXIT_NO_DATA:  # never an empty document over a good one
            raise AgentError(note or "no data", code)
        text = _render_status(result, fmt, all_nodes, gpus)
        if output_file or append_file:
            from agent import output
        if output_file:
            output.write_atomic(output_file, text)
        if append_file:
            output.append_line(append_file, status_ndjson(result, include_dead=all_nodes))
        if not output_file and not append_file:
            sys.stdout.write(text)
        if note:
            typer.echo(f"rayscope: {note}", err=True)
        _print_sources(result.sources)
    if code:
        raise typer.Exit(code)


def _gpu_memory_option(value: Optional[int]) -> Optional[int]:
    from agent import fit as fitting

    if value is not None and value != fitting.WHOLE_GPU and value <= 0:
        raise typer.BadParameter("must be more than 0 MB, or -1 for a whole GPU")
    return value


def _shape_option(value: Optional[str]) -> Optional[dict[str, float]]:
    if value is None:
        return None
    import json

    from agent import fit as fitting

    try:
        raw = json.loads(value)
    except ValueError as err:
        raise typer.BadParameter(f"not JSON: {err}", param_hint="'--shape'") from None
    if not isinstance(raw, dict):
        raise typer.BadParameter(
            'a JSON object of Ray resources, e.g. \'{"GPU": 0.5, "CPU": 1}\'', param_hint="'--shape'"
        )
    try:
        return fitting.validate_shape(raw)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="'--shape'") from None


@app.command()
def fit(
    gpu_memory_mb: Annotated[
        Optional[int],
        typer.Option(
            "--gpu-memory-mb",
            metavar="MB",
            callback=_gpu_memory_option,
            help="GPU memory per replica, as a BioEngine app declares it; -1 = a whole GPU.",
        ),
    ] = None,
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="How many replicas to place.")] = 1,
    num_cpus: Annotated[
        float,
        typer.Option(
            "--num-cpus",
            min=0,
            help=(
                "CPUs each replica books (Ray's num_cpus). 0 = as declared;"
                " a Ray Serve replica books 1 by default."
            ),
        ),
    ] = 0.0,
    memory_mb: Annotated[
        float, typer.Option("--memory-mb", min=0, help="Ray memory each replica books, in MB.")
    ] = 0.0,
    shape: Annotated[
        Optional[str],
        typer.Option(
            "--shape",
            metavar="JSON",
            help=(
                "A raw Ray resource shape per replica instead of --gpu-memory-mb:"
                ' \'{"GPU": 0.5, "CPU": 1}\' (Ray\'s names; memory in bytes).'
            ),
        ),
    ] = None,
    gpu_total_mb: Annotated[
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
    ] = None,
    sizing: Annotated[
        Sizing,
        typer.Option(
            "--sizing",
            help=(
                "How --gpu-memory-mb is booked: auto = BioEngine's rule (VRAM_MB where a node"
                " advertises it, else a GPU fraction), vram, or fraction."
            ),
        ),
    ] = Sizing.auto,
    json_out: Annotated[bool, typer.Option("--json", help="The placement as one JSON document.")] = False,
    head: HeadOption = None,
    gcs: GcsOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """Will another app fit? Places R replicas as Ray would book them.

    Sizes each replica the way BioEngine's AppBuilder does: where a node advertises
    VRAM_MB, GPU 0.01 plus VRAM_MB = MB; else GPU = MB / smallest GPU, clamped to 1 when up
    to 10% over, refused when more. Places the replicas greedily on what each node has
    free, then checks NVML's free memory on the chosen GPUs where it is measured.

    Exit 0: fits. Exit 1: does not fit (by booking, by measured memory, or refused).
    Exit 2: could not tell (cluster unreadable, a GPU size unknown) or bad usage.
    """
    if (gpu_memory_mb is None) == (shape is None):
        raise click.UsageError("give one of --gpu-memory-mb MB or --shape JSON")
    raw_shape = _shape_option(shape)
    if raw_shape is not None:
        if num_cpus > 0 and "CPU" in raw_shape:
            raise click.UsageError("--num-cpus and a CPU in --shape: give CPUs once")
        if memory_mb > 0 and "memory" in raw_shape:
            raise click.UsageError("--memory-mb and a memory in --shape: give memory once")
        if sizing is not Sizing.auto:
            raise click.UsageError("--sizing applies to --gpu-memory-mb, not to a raw --shape")
    request = FitRequest(
        gpu_memory_mb=gpu_memory_mb,
        shape=raw_shape,
        replicas=replicas,
        num_cpus=num_cpus,
        memory_mb=memory_mb,
        gpu_total_mb=gpu_total_mb,
        sizing=sizing.value,
    )
    from agent import fit as fitting

    with _one_line_errors():
        # gpus=True: the actor table too, for Ray's per-device placement (agent.placement).
        result = fitting.fit(_read_cluster(head, token_file, gcs, timeout, gpus=True), request)
        _print([fit_json(result)] if json_out else fit_lines(result))
    raise typer.Exit(fitting.exit_code(result))


@app.command()
def node(
    json_out: JsonOption = False,
    gcs: GcsOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    gpus: GpusOption = False,
) -> None:
    """This node's diagnostics: raylet, booking, GPUs, host, sources.

    Shows the raylet's identity and what the scheduler booked on it, the GPUs as NVML sees
    them, the host, the rayscope node agents running here (push or placed by Ray, by pid),
    and which sources answered. Runs on any node, with or without Ray importable. Exit code
    0 unless rayscope itself fails.
    """
    with _one_line_errors():
        from agent import collect

        diag = collect.node_diagnostics(gcs, timeout, gpus=gpus)
        _print([node_json(diag)] if json_out else node_lines(diag, gpus=gpus))
        _print_sources(diag.sources)


@app.command("head")
def head_agent(
    listen: Annotated[
        str,
        typer.Option(
            "--listen", metavar="HOST:PORT", callback=_endpoint(7531), help="Where node agents connect."
        ),
    ] = "127.0.0.1:7531",
    http: Annotated[
        str,
        typer.Option(
            "--http",
            metavar="HOST:PORT",
            callback=_endpoint(7532),
            help="GET /v1/status, /metrics, /healthz.",
        ),
    ] = "127.0.0.1:7532",
    gcs: GcsOption = None,
    interval: IntervalOption = 5.0,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    read_token_file: Annotated[
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
    ] = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
    max_pending: Annotated[
        int,
        typer.Option(
            "--max-pending",
            metavar="N",
            help="Connections per source address before their first good frame.",
        ),
    ] = 256,
    agents: Annotated[
        str,
        typer.Option(
            "--agents",
            metavar="none|ray",
            click_type=click.Choice(["none", "ray"]),
            help="ray: keep a node agent on every alive node, placed through Ray (removed at shutdown).",
        ),
    ] = "none",
    remove: Annotated[
        bool,
        typer.Option("--remove", help="With --agents ray: remove every agent placed through Ray, then exit."),
    ] = False,
) -> None:
    """The head agent: merges node reports with the scheduler's view.

    Takes the node agents' reports, reads the scheduler once per interval and serves the
    merged rollup over HTTP. A report older than 3 intervals is stale. Listening beyond
    loopback requires --token-file. Stops cleanly on SIGTERM.
    """
    import asyncio

    from agent import collect
    from agent.head.daemon import Head
    from agent.ray_agents import RayAgents

    with _one_line_errors():
        _daemon_logging()
        token, read_token = _token(token_file), _token(read_token_file)
        address = collect.resolve_gcs_here(gcs)
        if agents == "ray" and not address:
            raise AgentError("--agents ray needs the GCS address: pass --gcs HOST:PORT", EXIT_NO_DATA)
        keeper = (
            RayAgents(address, split_address(listen), token, interval)
            if agents == "ray" and address
            else None
        )
        if remove:
            if keeper is None:
                raise AgentError("--remove goes with --agents ray", EXIT_NO_DATA)
            try:
                removed = keeper.remove_all()
                keeper.close()
            except Exception as err:  # Ray's own errors: one line, as every other failure
                raise AgentError(f"cannot remove the agents placed through Ray: {err}", EXIT_FAILED) from None
            typer.echo(f"removed {removed} agent(s) placed through Ray")
            return
        try:
            tls = TlsFiles(tls_cert, tls_key, tls_ca)
            server = Head(
                split_address(listen),
                split_address(http),
                address,
                interval,
                token,
                timeout,
                read_token,
                tls,
                max_pending,
                agents=keeper,
            )
            asyncio.run(server.serve())
        except ValueError as err:
            raise AgentError(str(err), EXIT_NO_DATA) from None
        except OSError as err:
            raise AgentError(f"head agent cannot start: {err.strerror or err}", EXIT_FAILED) from None


@app.command()
def push(
    head: Annotated[
        str,
        typer.Option(
            "--head",
            metavar="HOST:PORT",
            callback=_endpoint(7531),
            help="The head agent's report port (7531).",
        ),
    ],
    interval: IntervalOption = 5.0,
    token_file: TokenFileOption = None,
    node_id: Annotated[
        Optional[str],
        typer.Option(
            "--node-id", metavar="ID", help="The Ray node to report for (default: the local raylet's)."
        ),
    ] = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
) -> None:
    """The node agent: sends this node's facts to the head agent.

    Every interval (with jitter) it sends this node's raylet, NVML and host facts over one
    persistent connection. It reconnects with backoff, never queues old reports, and stops
    cleanly on SIGTERM.
    """
    from agent.push import Pusher

    with _one_line_errors():
        _daemon_logging()
        from agent.tls import client_context

        try:
            context = client_context(TlsFiles(tls_cert, tls_key, tls_ca))
        except ValueError as err:
            raise AgentError(str(err), EXIT_NO_DATA) from None
        Pusher(split_address(head), _token(token_file), interval, node_id, ssl_context=context).run()


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


def reflow(doc: str) -> str:
    """A docstring as help text: paragraphs kept, the source's line breaks inside them
    dropped, so the terminal wraps each paragraph once, at its own width."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


for _command in app.registered_commands:
    if _command.callback is not None and _command.callback.__doc__:
        _command.help = reflow(_command.callback.__doc__)


def main() -> None:
    """Console-script entry point."""
    app(args=optional_watch_value(sys.argv[1:]), prog_name="rayscope")
