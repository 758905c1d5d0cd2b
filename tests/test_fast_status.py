"""``status --head``'s fast path (agent/rayscope/cli/fast_status.py,
agent/rayscope/client/request.py) prints what
the typer CLI prints, byte for byte, with the same exit code, for the same head answer and
the same options; and hands the CLI everything else.

A fake head serves the contract of ``GET /v1/status?format=lines`` (the lines ``status``
prints, ``X-Rayscope-Exit``, ``-Note``, ``-Notes``, ``-Schema``) and of the JSON document,
rendered by rayscope's own functions from the scenarios' statuses; an "old" head ignores
``format=`` and sends no ``X-Rayscope-*`` header, a "chunked" one answers like a proxy that
re-chunks (both paths read it: one transport). Each case runs the whole entry point
(``rayscope.__main__.main``: the fast path, then the CLI when it hands on) beside the CLI
alone (``rayscope.cli.app.main``), in this process.
Positive control: print the body without ``printable`` in ``fast_status._lines_text`` (the
bent wire's escape sequences reach stdout), or drop ``said.note`` (every partial case differs).
"""

import socket
import ssl
from pathlib import Path
from typing import Any, Callable, TypeVar

import msgspec
import pytest

from rayscope.cli import fast_status
from rayscope.net import http as net_http
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import ClusterStatus
from tests import scenarios
from tests.conftest import write_token
from tests.support.fake_head import Run, fake_head, planted, run_cli, run_entry
from tests.support.ports import refused_port

Headers = list[tuple[str, str]]


def _no_data() -> ClusterStatus:
    status = scenarios.head_view([], {})
    return msgspec.structs.replace(
        status, sources=[SourceStatus(name="gcs", ok=False, reason="GCS unreachable at 10.0.0.1:6379")]
    )


STATUSES: dict[str, Callable[[], ClusterStatus]] = {
    "seed": scenarios.seed_status,
    "mixed": scenarios.mixed_status,  # a dead node, a stale report: exit 1 and its note
    "pending": scenarios.pending_status,
    "busy": scenarios.busy_gpu_status,
    "no-data": _no_data,
    "planted": planted,
}
OPTIONS = [
    [],
    ["--all"],
    ["--gpus"],
    ["--gpus", "--all"],
    ["--json"],
    ["--json", "--all", "--gpus"],
    ["--format", "json"],
    ["--format=text", "--timeout", "3"],
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*fast_status.ENVIRONMENT.values(), "RAYSCOPE_GCS"]:
        monkeypatch.delenv(name, raising=False)


def handled_fast(argv: list[str], capsys: pytest.CaptureFixture[str]) -> bool:
    """Whether the fast path answered ``argv`` itself (it exits) rather than handing it on."""
    try:
        fast_status.run(argv)
    except SystemExit:
        capsys.readouterr()
        return True
    capsys.readouterr()
    return False


BothPaths = Callable[[list[str], bool], Run]
"""Runs ``rayscope ARGV`` on both paths: see :func:`both_paths`."""


Test = TypeVar("Test", bound=Callable[..., None])


def each_case(
    statuses: dict[str, Callable[[], ClusterStatus]], options: list[list[str]]
) -> Callable[[Test], Test]:
    """Parametrize a test over ``statuses`` by name, each of ``options``, with and without ``-v``."""

    marks = [  # as stacked decorators: the last is the outermost
        pytest.mark.parametrize("name", sorted(statuses)),
        pytest.mark.parametrize("options", options, ids=[" ".join(o) or "text" for o in options]),
        pytest.mark.parametrize("verbose", [False, True], ids=["", "verbose"]),
    ]

    def parametrized(test: Test) -> Test:
        for mark in marks:
            test = mark(test)
        return test

    return parametrized


@pytest.fixture
def both_paths(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> BothPaths:
    """``rayscope ARGV`` (after ``-v`` where ``verbose``) through the entry point and through the
    CLI alone: asserts both give the same exit code and bytes (with ``-v``, an exit 2's last
    line: each path's traceback has its own frames), and that the fast path answered."""

    def run(argv: list[str], verbose: bool) -> Run:
        argv = [*(["-v"] if verbose else []), *argv]
        fast = run_entry(argv, capsys, monkeypatch)
        typer_path = run_cli(argv, capsys)
        if verbose and fast[0] == 2:
            fast, typer_path = [(c, out, err.splitlines()[-1]) for c, out, err in (fast, typer_path)]
        else:
            assert "Traceback" not in fast[2]
        assert fast == typer_path
        assert handled_fast(argv, capsys)
        return fast

    return run


@each_case(STATUSES, OPTIONS)
def test_the_fast_path_prints_what_the_cli_prints(
    name: str, options: list[str], verbose: bool, both_paths: BothPaths
) -> None:
    with fake_head(STATUSES[name]()) as head:
        fast = both_paths(["status", "--head", head.url, *options], verbose)
        asked = head.requests[0]
    assert ("format=lines" in asked) == ("--json" not in options and "json" not in options)
    if name == "planted" and "--json" not in options and "json" not in options:
        assert "\x1b" not in fast[1] and "\u2028" not in fast[1] and "gpu[2J-01x" in fast[1]


def test_escape_sequences_on_the_wire_never_reach_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines the head did not make printable (or a wire without TLS that bent them) are
    printed through the one printable rule, as the CLI's own renderers print: the control
    characters go, what is left of the sequence is plain text."""
    with fake_head(scenarios.seed_status(), "bent") as head:
        code, out, err = run_entry(["status", "--head", head.url], capsys, monkeypatch)
        assert (code, err) == (0, "")
        assert "\x1b" not in out and "\x07" not in out and "\u2028" not in out
        assert out.splitlines()[0].startswith("]0;ownedCluster: ") and out.count("\n") == len(
            out.splitlines()
        )
        assert head.requests[0].startswith("/v1/status?format=lines")


@pytest.mark.parametrize("mode", ["old", "chunked"])
@pytest.mark.parametrize("options", [[], ["--json"], ["--gpus", "--all"]], ids=["text", "json", "gpus all"])
def test_an_older_head_goes_to_the_cli_and_a_chunking_proxy_is_read_by_either(
    mode: str, options: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older head (``format=`` ignored, no ``X-Rayscope-*``): the CLI asks again and
    prints what it always printed. A proxy that chunks: both paths read it with the one
    transport (agent/rayscope/client/request.py), so the fast path prints it itself, the same bytes."""
    with fake_head(scenarios.mixed_status(), mode) as head:
        argv = ["status", "--head", head.url, *options]
        assert run_entry(argv, capsys, monkeypatch) == run_cli(argv, capsys)
        assert handled_fast(argv, capsys) == (mode == "chunked")
        assert any("format=lines" not in r and "all=1" in r for r in head.requests)  # the CLI's request


@pytest.mark.parametrize("code", [401, 404, 500])
def test_a_refusal_is_the_clis_one_line(
    code: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with fake_head(scenarios.seed_status(), f"http-{code}") as head:
        argv = ["status", "--head", head.url]
        fast = run_entry(argv, capsys, monkeypatch)
        assert fast == run_cli(argv, capsys)
        # A refusal is rare and the CLI's path names what it means (a wrong token from a
        # missing one, a server that is not a head): the fast path leaves it to that path.
        assert not handled_fast(argv, capsys)
    assert fast[0] == 2 and fast[1] == "" and fast[2].count("\n") == 1
    if code == 401:
        assert (
            fast[2]
            == f"rayscope: head agent at {head.url} requires a token: pass --token-file (the head's)\n"
        )


def test_unreachable_and_timeout_are_the_clis_lines_said_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed port and a head that takes the connection and never answers: said by the
    fast path itself, in the CLI's words, without asking a second time (the wait would
    double)."""
    closed = f"http://127.0.0.1:{refused_port()}"
    argv = ["status", "--head", closed]
    fast = run_entry(argv, capsys, monkeypatch)
    assert (
        fast
        == run_cli(argv, capsys)
        == (2, "", f"rayscope: head agent unreachable at {closed} (connection refused)\n")
    )
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        argv = ["status", "--head", url, "--timeout", "0.3"]
        expected = (2, "", f"rayscope: head agent unreachable at {url} (timeout 0.3 s)\n")
        assert run_entry(argv, capsys, monkeypatch) == run_cli(argv, capsys) == expected
        assert handled_fast(argv, capsys)


def test_token_and_tls_file_errors_are_the_clis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    open_token = tmp_path / "token"
    open_token.write_text("secret-token-value\n")
    open_token.chmod(0o644)
    with fake_head(scenarios.seed_status()) as head:
        for extra in (
            ["--token-file", str(open_token)],
            ["--token-file", str(tmp_path / "missing")],
            ["--tls-ca", str(tmp_path / "missing.pem")],
            ["--tls-cert", str(tmp_path / "c.pem")],
        ):
            argv = ["status", "--head", head.url, *extra]
            fast = run_entry(argv, capsys, monkeypatch)
            assert fast == run_cli(argv, capsys), extra
            assert fast[0] == 2 and fast[2].count("\n") == 1 and "secret" not in fast[2], fast


@pytest.mark.parametrize("client", ["verified", "no CA", "no client certificate", "plain http"])
def test_over_tls_the_fast_path_reads_and_fails_as_the_cli_does(
    client: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head with mutual TLS (its certificate, clients' signed by the CA): read with the
    right files, refused without the CA (the system's CAs do not know it), without a client
    certificate, or as plain HTTP; each the CLI's answer, said once."""
    from tests.support.pki import make_pki, tls_options

    pki = make_pki(tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(pki["head.pem"]), str(pki["head.key"]))
    server.load_verify_locations(str(pki["ca.pem"]))
    server.verify_mode = ssl.CERT_REQUIRED
    files = {
        "verified": tls_options(pki, "client"),
        "no CA": ["--tls-cert", str(pki["client.pem"]), "--tls-key", str(pki["client.key"])],
        "no client certificate": ["--tls-ca", str(pki["ca.pem"])],
        "plain http": [],
    }[client]
    with fake_head(scenarios.mixed_status(), tls=server) as head:
        url = head.url.replace("https", "http") if client == "plain http" else head.url
        argv = ["status", "--head", url, "--timeout", "3", *files]
        fast, typer_path = run_entry(argv, capsys, monkeypatch), run_cli(argv, capsys)
        if client == "no client certificate":  # TLS 1.3 races the server's alert with the
            # client's request: either path reads the alert or an EOF, run to run
            fast, typer_path = [(c, o, e.partition(" (")[0] + "\n") for c, o, e in (fast, typer_path)]
        assert fast == typer_path
        assert handled_fast(argv, capsys)
    if client == "verified":
        assert fast[0] == 1 and "partial" in fast[2]
    else:
        assert (
            fast[0] == 2
            and fast[1] == ""
            and fast[2].startswith(f"rayscope: head agent unreachable at {url}")
        )
        assert fast[2].count("\n") == 1


def test_the_environment_is_read_as_the_cli_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = write_token(tmp_path / "token", "0123456789abcdef")
    with fake_head(scenarios.mixed_status()) as head:
        monkeypatch.setenv("RAYSCOPE_HEAD", head.url)
        monkeypatch.setenv("RAYSCOPE_TOKEN_FILE", str(token))
        monkeypatch.setenv("RAYSCOPE_TLS_CA", "")  # empty: unset, as click has it
        fast = run_entry(["status", "--all"], capsys, monkeypatch)
        assert fast == run_cli(["status", "--all"], capsys)
        assert handled_fast(["status", "--all"], capsys)
        assert fast[0] == 1 and "partial" in fast[2]


@pytest.mark.parametrize(
    "words",
    [
        ["--help"],
        ["-h"],
        ["--output", "f"],
        ["--append", "f"],
        ["--watch"],
        ["--watch", "2"],
        ["--format", "prom"],
        ["--format", "TEXT"],
        ["--json", "--format", "text"],
        ["--all", "--all"],
        ["--timeout", "1", "--timeout=2"],
        ["--token-file", "--all"],
        ["--token-file"],
        ["--all=1"],
        ["--gcs", "127.0.0.1:6379"],
        ["--bogus"],
        ["extra"],
        ["--"],
        ["-v"],
    ],
)
def test_what_the_fast_path_does_not_know_goes_to_the_cli(words: list[str]) -> None:
    assert fast_status.parse(["--head", f"http://127.0.0.1:{refused_port()}", *words], False, {}) is None


@pytest.mark.parametrize(
    "value",
    ["5", "0.001", "86400", " 7 ", "1e2", "1_0", "0", "-1", "86400.5", "nan", "inf", "-inf", "abc", ""],
)
def test_the_fast_path_takes_exactly_the_timeouts_the_cli_takes(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every ``--timeout`` the fast path takes is one the CLI takes, and the reverse: a value
    it does not take goes to the CLI, which refuses it (exit 2, naming ``--timeout``)."""
    url = f"http://127.0.0.1:{refused_port()}"
    taken = fast_status.parse(["--head", url, f"--timeout={value}"], False, {}) is not None
    code, _, err = run_cli(["status", "--head", url, f"--timeout={value}"], capsys)
    refused = code == 2 and "--timeout" in err
    assert taken != refused, err


def test_the_fast_path_and_the_cli_read_one_declaration_of_statuss_options() -> None:
    """Every option ``status`` takes in the typer app that the fast path knows has the names,
    parameter and variable of its one declaration (agent/rayscope/cli/names.py), and every
    declaration is an option of ``status``; the global flags are the app's."""
    from rayscope.cli import names, typer_click
    from rayscope.cli.app import app

    root = typer_click.root_command(app)
    status = typer_click.commands(root)["status"]
    typer_side = {p.name: (tuple(p.opts), p.envvar) for p in status.params}
    for declared in names.STATUS:
        assert typer_side.get(declared.key) == (declared.flags, declared.env), declared
        for flag in declared.flags:
            assert (fast_status.VALUES if declared.takes_value else fast_status.FLAGS)[flag] == declared.key
    assert len(fast_status.VALUES) + len(fast_status.FLAGS) == sum(len(n.flags) for n in names.STATUS)
    verbose = next(p for p in root.params if p.name == names.VERBOSE.key)
    assert tuple(verbose.opts) == names.VERBOSE.flags == fast_status.GLOBAL_FLAGS


def test_parse_head_answer_headers_strictly() -> None:
    assert net_http.parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A:  b ") == (
        200,
        {"content-length": "3", "x-a": "b"},
    )
    # a repeated header is one list (RFC 9110, 5.3), as a proxy may send it
    assert net_http.parse_head(
        b"HTTP/1.1 200 OK\r\nVary: a\r\nvary: b\r\nContent-Length: 3\r\nContent-Length: 3"
    ) == (200, {"vary": "a, b", "content-length": "3"})
    for bad in (
        b"HTTP/2 200 OK",
        b"HTTP/1.1 20x OK",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 \xb200 OK",  # '\xb2' is '²' in latin-1: isdigit(), and int() raises
        b"HTTP/1.1 +20 OK",
        b"HTTP/1.1 020 OK",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\ncontent-length: 4",
        b"HTTP/1.1 200 OK\r\n folded",
        b"HTTP/1.1 200 OK\r\nno colon",
        b"HTTP/1.1 200 OK\r\nX A: 1",
    ):
        with pytest.raises(net_http.BadAnswer):
            net_http.parse_head(bad)


EMBEDDED = {
    "embedded": scenarios.embedded_seed_status,
    "pending": scenarios.pending_status,
    "no-data": _no_data,
}
EMBEDDED_OPTIONS = [
    [],
    ["--all", "--gpus"],
    ["--json"],
    ["--format", "prom"],
    ["--gcs", "10.0.0.1:6379", "--timeout=2.5"],
]


@each_case(EMBEDDED, EMBEDDED_OPTIONS)
def test_the_embedded_status_without_typer_prints_what_the_cli_prints(
    name: str, options: list[str], verbose: bool, both_paths: BothPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status`` without a head, answered without the CLI's imports: the same read (the
    same arguments to ``client.read_cluster``), the same bytes and exit code."""
    from rayscope.client import head as client
    from rayscope.sources.gcs import prestart as gcs_prestart

    reads: list[tuple[Any, ...]] = []

    def read_cluster(*args: Any) -> ClusterStatus:
        reads.append(args[:5])
        return EMBEDDED[name]()

    monkeypatch.setattr(client, "read_cluster", read_cluster)
    monkeypatch.setattr(gcs_prestart, "start", lambda *a: reads.append(("prestart",)))
    both_paths(["status", *options], verbose)
    prestart, fast_read, cli_read = reads[0], reads[1], reads[2]
    assert prestart == ("prestart",) and fast_read == cli_read


@pytest.mark.parametrize(
    "words",
    [
        ["--gcs", "ray://foo:10001"],
        ["--gcs", "127.0.0.1:99999"],
        ["--timeout", "0"],
        ["--token-file", "t"],
        ["--watch"],
    ],
)
def test_an_embedded_status_the_fast_path_does_not_take_still_starts_the_gcs_child(
    words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI reads the GCS (or refuses the value): the child is started either way, and
    killed at exit when no read takes it."""
    from rayscope.sources.gcs import prestart as gcs_prestart

    started: list[bool] = []
    monkeypatch.setattr(gcs_prestart, "start", lambda *a: started.append(True))
    fast_status.run(["status", *words])
    assert started == [True]
    assert fast_status.parse(words, False, {}) is None
