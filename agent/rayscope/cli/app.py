"""The ``rayscope`` command: typer commands and their options only; each command is one call
into the module that does the work, inside :func:`~rayscope.errors.one_line_errors`.

Errors are one line on stderr and a non-zero exit code, never a traceback (``--verbose``
shows one). Exit codes: 0 = answered, 1 = failed, 2 = no data (the cluster could not be
read) or bad usage, 70 = an internal error (errors.EXIT_INTERNAL).
"""

import sys
from collections.abc import Sequence
from typing import Annotated, Optional

import typer

# Deliberately not rayscope.node.collect here: it pulls psutil and pynvml, which `status --head`
# (the fast path, benchmarked against `ray status`) does not need; the commands that need
# collect, fit, the head or the agent import them where they are used.
from rayscope import SUPPORTED_PYTHON, SUPPORTED_RAY, __version__
from rayscope.cli import argv as cmdline
from rayscope.cli import names, output
from rayscope.cli.daemon_options import (
    Agents,
    AgentsOption,
    HttpHostOption,
    HttpOption,
    ListenOption,
    MaxPendingOption,
    NodeIdOption,
    PushHeadOption,
    ReadTokenFileOption,
    RemoveOption,
)
from rayscope.cli.label_options import LabelSelectorOption
from rayscope.cli.options import (
    AllNodesOption,
    AppendFileOption,
    DashboardOption,
    FormatOption,
    GcsOption,
    GpuMemoryOption,
    GpusOption,
    GpuTotalOption,
    HeadOption,
    IntervalOption,
    JsonOption,
    MemoryMbOption,
    NumCpusOption,
    OutputFileOption,
    ReplicasOption,
    ShapeOption,
    Sizing,
    SizingOption,
    TimeoutOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    TokenFileOption,
    WatchOption,
    reflow,
)
from rayscope.cli.usage_options import HeadroomOption, UsageStateOption, UsageWindowOption, WindowOption
from rayscope.client import head as client
from rayscope.core.rollup import STALE_INTERVALS
from rayscope.defaults import DEFAULT_HTTP_PORT, DEFAULT_REPORT_PORT, DEFAULT_TIMEOUT_S
from rayscope.errors import one_line_errors
from rayscope.net.tls import TlsFiles
from rayscope.render.status import source_details, status_text_lines
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import ClusterStatus

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
        bool, typer.Option(*names.VERBOSE.flags, help="Show tracebacks and which sources answered.")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    global _verbose
    _verbose = verbose


def _print_sources(sources: list[SourceStatus]) -> None:
    """With ``--verbose``: which sources answered, and through what (the GCS read names the
    interpreter it ran under), on stderr so that ``--json`` output stays one document."""
    if _verbose:
        sys.stderr.write("\n".join(source_details(sources)) + "\n")


@app.command()
def status(
    json_out: JsonOption = False,
    all_nodes: AllNodesOption = False,
    head: HeadOption = None,
    gcs: GcsOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    gpus: GpusOption = False,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
    format_: FormatOption = None,
    output_file: OutputFileOption = None,
    append_file: AppendFileOption = None,
    watch_s: WatchOption = None,
    dashboard: DashboardOption = None,
) -> None:
    """Cluster status: GPU and VRAM_MB booked, VRAM measured, per node.

    Per node and summed for the cluster: the GPU fraction booked, the VRAM_MB booked and
    the GPU memory NVML measures. With --head (or $RAYSCOPE_HEAD) it asks a head agent,
    which merges every node agent's NVML with the scheduler's view. Without, it reads the
    scheduler's view of every node from the GCS (no ray.init, no job), NVML on this host,
    and for the other nodes what Ray's dashboard agents measured (where Ray runs its
    dashboard). The JSON's
    "view" says which, and each node's used_gpu_memory_source where its figure comes from.

    Exit 0: complete. Exit 1: partial (the report of a node whose agent was reporting is
    stale, or the scheduler's view is older than {stale_intervals} intervals, or missing
    while agents report). Exit 2: no data (head or GCS unreachable, no address) or bad
    usage. Exit 3: the --output or --append FILE could not be written. Nodes that run no
    agent are not partial data.
    """
    tls = TlsFiles(tls_cert, tls_key, tls_ca)
    with one_line_errors(_verbose):
        fmt = output.status_format(json_out, format_.value if format_ else None, output_file)

        def read() -> ClusterStatus:
            return client.read_cluster(head, token_file, gcs, timeout, gpus, tls, dashboard)

        if watch_s is not None:
            from rayscope.cli import watch

            plain = fmt == "text" and not output_file and not append_file
            lines = lambda result: status_text_lines(result, all_nodes, gpus)  # noqa: E731
            raise SystemExit(watch.watch_status(read, lines, watch_s, plain))
        result = read()
        code = output.deliver_status(result, fmt, all_nodes, gpus, output_file, append_file)
        _print_sources(result.sources)
    raise SystemExit(code)


@app.command()
def fit(
    gpu_memory_mb: GpuMemoryOption = None,
    replicas: ReplicasOption = 1,
    num_cpus: NumCpusOption = 0.0,
    memory_mb: MemoryMbOption = 0.0,
    shape: ShapeOption = None,
    gpu_total_mb: GpuTotalOption = None,
    sizing: SizingOption = Sizing.auto,
    json_out: Annotated[bool, typer.Option("--json", help="The placement as one JSON document.")] = False,
    head: HeadOption = None,
    gcs: GcsOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    dashboard: DashboardOption = None,
    label_selector: LabelSelectorOption = None,
) -> None:
    """Will another app fit? Places R replicas as Ray would book them.

    Sizes each replica the way BioEngine's AppBuilder does: where a node advertises
    VRAM_MB, GPU 0.01 plus VRAM_MB = MB; else GPU = MB / smallest GPU, clamped to 1 when up
    to 10% over, refused when more. Places the replicas greedily on what each node has
    free, then checks NVML's free memory on the chosen GPUs where it is measured (by an
    agent, this host, or Ray's dashboard).

    Exit 0: fits. Exit 1: does not fit (by booking, by measured memory, or refused).
    Exit 2: could not tell (cluster unreadable, a GPU size unknown) or bad usage.
    """
    from rayscope.client import api
    from rayscope.core.capacity import fit as fitting
    from rayscope.core.capacity.fit_labels import label_options, with_label_selector
    from rayscope.core.capacity.sizing import fit_request, size_warning
    from rayscope.render.fit import fit_json, fit_lines

    with one_line_errors(_verbose):
        request = fit_request(gpu_memory_mb, shape, replicas, num_cpus, memory_mb, gpu_total_mb, sizing.value)
        warning = size_warning(request.gpu_memory_mb)
        if warning:
            sys.stderr.write(f"rayscope: warning: {warning}\n")
        request = with_label_selector(request, label_options(label_selector or []))
        result = api.fit_result(request, api.Source(head, gcs, dashboard), token_file, timeout)
        output.to_stdout((fit_json(result) if json_out else "\n".join(fit_lines(result))) + "\n")
    raise SystemExit(fitting.exit_code(result))


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
    and which sources answered. Runs on any node, with or without Ray importable. Exit 0:
    answered (what could not be read is said in its line). Exit 2: bad usage (an option's
    value, e.g. --gcs ray://HOST). Exit 70: rayscope itself failed.
    """
    with one_line_errors(_verbose):
        from rayscope.node import collect
        from rayscope.render.node import node_json, node_lines

        diag = collect.node_diagnostics(gcs, timeout, gpus=gpus)
        output.to_stdout((node_json(diag) if json_out else "\n".join(node_lines(diag, gpus=gpus))) + "\n")
        _print_sources(diag.sources)


@app.command("head")
def head_agent(
    listen: ListenOption = f"127.0.0.1:{DEFAULT_REPORT_PORT}",
    http: HttpOption = f"127.0.0.1:{DEFAULT_HTTP_PORT}",
    http_host: HttpHostOption = None,
    gcs: GcsOption = None,
    interval: IntervalOption = 5.0,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    read_token_file: ReadTokenFileOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
    max_pending: MaxPendingOption = 256,
    agents: AgentsOption = Agents.none,
    remove: RemoveOption = False,
    usage_window: UsageWindowOption = 3600.0,
    usage_state: UsageStateOption = None,
    dashboard: DashboardOption = None,
) -> None:
    """The head agent: merges node reports with the scheduler's view.

    Takes the node agents' reports, reads the scheduler once per interval and serves the
    merged rollup over HTTP. A report older than {stale_intervals} intervals is stale.
    Listening beyond loopback requires --token-file. Stops cleanly on SIGTERM.
    """
    from rayscope.head import daemon
    from rayscope.sinks.logs import daemon_logging

    with one_line_errors(_verbose):
        daemon_logging(_verbose)
        said = daemon.run(
            listen=listen,
            http=http,
            gcs_address=gcs,
            interval_s=interval,
            token_file=token_file,
            timeout_s=timeout,
            read_token_file=read_token_file,
            tls=TlsFiles(tls_cert, tls_key, tls_ca),
            max_pending=max_pending,
            agents=agents.value,
            remove=remove,
            usage_window_s=usage_window,
            usage_state=usage_state,
            http_hosts=tuple(http_host or ()),
            dashboard=dashboard,
        )
        if said:
            typer.echo(said)


@app.command()
def usage(
    head: HeadOption = None,
    token_file: TokenFileOption = None,
    json_out: JsonOption = False,
    window: WindowOption = None,
    headroom: HeadroomOption = 10.0,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
) -> None:
    """Each app's peak GPU memory beside its booking, and what to book.

    Per app (a Ray Serve or BioEngine deployment, else the actor class) and per replica:
    the booking, the peak and p95 of the memory its processes held over the head's window,
    and a suggested booking (peak + headroom, rounded up to 256 MiB) with what re-booking
    frees, or the OOM risk where the peak exceeds the booking. Needs a head agent.
    """
    from rayscope.render.usage import usage_json, usage_lines

    with one_line_errors(_verbose):
        tls = TlsFiles(tls_cert, tls_key, tls_ca)
        doc = client.read_usage(head, token_file, timeout, window, headroom, tls)
        output.to_stdout((usage_json(doc) if json_out else "\n".join(usage_lines(doc))) + "\n")


@app.command()
def push(
    head: PushHeadOption,
    interval: IntervalOption = 5.0,
    token_file: TokenFileOption = None,
    node_id: NodeIdOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
) -> None:
    """The node agent: sends this node's facts to the head agent.

    Every interval (with jitter) it sends this node's raylet, NVML and host facts over one
    persistent connection. It reconnects with backoff, never queues old reports, and stops
    cleanly on SIGTERM.
    """
    from rayscope.node import push as pushing
    from rayscope.sinks.logs import daemon_logging

    with one_line_errors(_verbose):
        daemon_logging(_verbose)
        pushing.run(head, token_file, interval, node_id, TlsFiles(tls_cert, tls_key, tls_ca))


for _command in app.registered_commands:
    if _command.callback is not None and _command.callback.__doc__:
        _command.help = reflow(_command.callback.__doc__, stale_intervals=STALE_INTERVALS)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console-script entry point: a usage error is one line too (exit 2)."""
    cmdline.run(app, sys.argv[1:] if argv is None else argv)
