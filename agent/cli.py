"""The ``rayscope`` command: typer commands only; the work is done by the modules they call.

Errors are one line on stderr and a non-zero exit code, never a traceback (``--verbose``
shows one). Exit codes: 0 = answered, 1 = failed, 2 = no data (the cluster could not be
read) or bad usage.
"""

import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Optional

import typer

from agent import __version__, collect, render
from agent.errors import AgentError
from agent.sources.gcs import ADDRESS_ENV, DEFAULT_TIMEOUT_S, parse_address

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
    gcs: GcsOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    gpus: GpusOption = False,
) -> None:
    """Cluster status: per node and summed, GPU fraction booked, VRAM_MB booked, NVML memory.

    Reads the scheduler's view of every node from the GCS (no ray.init, no job) and NVML
    on this host. Exit codes: 0 = answered; 2 = no data (GCS unreachable, no address).
    """
    with _one_line_errors():
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
        diag = collect.node_diagnostics(gcs, timeout, gpus=gpus)
        _print([render.node_json(diag)] if json_out else render.node_lines(diag, gpus=gpus))


def main() -> None:
    """Console-script entry point."""
    app(prog_name="rayscope")
