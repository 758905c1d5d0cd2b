"""The ``rayscope`` command: typer commands only; the work is done by the modules they call.

Errors are one line on stderr and a non-zero exit code, never a traceback (``--verbose``
shows one). Exit codes: 0 = answered, 1 = failed, 2 = no data (the cluster could not be
read) or bad usage.
"""

import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Optional

import typer

# Deliberately not agent.collect here: it pulls psutil and pynvml, which `status --head`
# (the fast path) does not need; the commands that do import it themselves.
from agent import __version__, client, render, wire
from agent.errors import AgentError
from agent.sources.gcs import ADDRESS_ENV, DEFAULT_TIMEOUT_S, parse_address, split_address

app = typer.Typer(
    name="rayscope",
    help=(
        "Booked vs measured GPU state of a Ray cluster. Shows, per node and for the"
        " cluster, the three GPU numbers that differ: device handles (Ray's GPU"
        " fraction), booked VRAM (the VRAM_MB resource, MB) and measured VRAM (NVML)."
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
            traceback.print_exc()
        typer.echo(f"rayscope: {err}", err=True)
        raise typer.Exit(err.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as err:  # a bug of ours: still one line unless asked for more
        if _verbose:
            traceback.print_exc()
        typer.echo(f"rayscope: internal error: {type(err).__name__}: {err} (--verbose shows where)", err=True)
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
            f"GCS address of the cluster. Default: ${ADDRESS_ENV}, else the local raylet's,"
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
    try:
        return wire.read_token(path)
    except ValueError as err:
        raise AgentError(str(err), 2) from None


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


def _print(lines: list[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")


@app.command()
def status(
    json_out: JsonOption = False,
    all_nodes: Annotated[bool, typer.Option("--all", help="Show dead nodes too.")] = False,
    head: Annotated[
        Optional[str],
        typer.Option(
            "--head",
            metavar="URL",
            envvar=client.HEAD_ENV,
            callback=_head_url,
            help="Read a head agent (http://HOST:7532) instead of the GCS: every node's NVML.",
        ),
    ] = None,
    gcs: GcsOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    gpus: GpusOption = False,
) -> None:
    """Cluster status: per node and summed, GPU fraction booked, VRAM_MB booked, NVML memory.

    With --head (or $RAYSCOPE_HEAD) it asks a head agent, which merges every node agent's
    NVML with the scheduler's view. Without, it reads the scheduler's view of every node
    from the GCS (no ray.init, no job) and NVML on this host only. The JSON's "view" says
    which. Exit codes: 0 = answered; 2 = no data (head or GCS unreachable, no address).
    """
    with _one_line_errors():
        if head:
            result = client.head_status(head, _token(token_file), timeout, gpus=gpus)
        else:
            from agent import collect

            result = collect.embedded_status(gcs, timeout, gpus=gpus)
        if json_out:
            _print([render.status_json(result, include_dead=all_nodes)])
        else:
            lines = render.status_lines(result, include_dead=all_nodes)
            _print(lines + render.status_gpu_lines(result, include_dead=all_nodes) if gpus else lines)


@app.command()
def node(
    json_out: JsonOption = False,
    gcs: GcsOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    gpus: GpusOption = False,
) -> None:
    """This node's diagnostics: raylet identity and booking, GPUs (NVML), host, and which
    sources answered. Runs on any node, with or without Ray importable; exit code 0 unless
    rayscope itself fails."""
    with _one_line_errors():
        from agent import collect

        diag = collect.node_diagnostics(gcs, timeout, gpus=gpus)
        _print([render.node_json(diag)] if json_out else render.node_lines(diag, gpus=gpus))


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
) -> None:
    """The head agent: takes node agents' reports, reads the scheduler once per interval,
    serves the merged rollup over HTTP. A report older than 3 intervals is stale. Listening
    beyond loopback requires --token-file. Stops cleanly on SIGTERM."""
    import asyncio

    from agent import collect
    from agent.head import Head

    with _one_line_errors():
        _daemon_logging()
        token = _token(token_file)
        address = collect.resolve_gcs_here(gcs)
        try:
            server = Head(split_address(listen), split_address(http), address, interval, token, timeout)
            asyncio.run(server.serve())
        except ValueError as err:
            raise AgentError(str(err), 2) from None
        except OSError as err:
            raise AgentError(f"head agent cannot start: {err.strerror or err}", 1) from None


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
) -> None:
    """The node agent: every interval (with jitter) sends this node's raylet, NVML and host
    facts to the head agent over one persistent connection; reconnects with backoff; never
    queues old reports; stops cleanly on SIGTERM."""
    from agent.push import Pusher

    with _one_line_errors():
        _daemon_logging()
        Pusher(split_address(head), _token(token_file), interval, node_id).run()


def main() -> None:
    """Console-script entry point."""
    app(prog_name="rayscope")
