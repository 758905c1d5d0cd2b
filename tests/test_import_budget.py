"""What ``status --head`` may import: its fast path (agent/rayscope/cli/fast_status.py,
docs/fast-status.md) exists so that a cron job's read of the head costs a plain socket and
msgspec, not typer, click, ``http.client``, ray, psutil or pynvml. Nothing else held that:
an import added at the top of a shared module would silently put the CLI back on the path.

Positive control: add ``import typer`` at the top of agent/rayscope/client/request.py and
both tests name typer and click.
"""

import subprocess
import sys

import pytest

from tests.conftest import REPO, base_env
from tests.support.fake_head import fake_head, planted
from tests.support.ports import refused_port

NOT_ON_THE_FAST_PATH = ("typer", "click", "http.client", "ray", "psutil", "pynvml", "urllib.request")


def imported_modules(argv: list[str]) -> tuple[set[str], "subprocess.CompletedProcess[str]"]:
    """The modules a fresh ``python -X importtime -m rayscope ARGV`` imports, by name."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rayscope", *argv],
        cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2 and "cumulative" not in line
    }
    return names, done


@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["lines", "json"])
def test_status_head_imports_neither_the_cli_nor_http_client(extra: list[str]) -> None:
    with fake_head(planted()) as head:
        names, done = imported_modules(["status", "--head", head.url, *extra])
    assert done.stdout.strip(), done.stderr[-2000:]  # it answered (not an import error)
    assert head.requests, "the head was asked"
    assert "rayscope.cli.fast_status" in names
    heavy = sorted(n for n in names if n.split(".")[0] in NOT_ON_THE_FAST_PATH or n in NOT_ON_THE_FAST_PATH)
    assert heavy == [], f"status --head{' ' + ' '.join(extra) if extra else ''} imported {heavy}"


def test_the_fast_path_runs_without_the_collector_and_gives_it_back(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rayscope.__main__.main`` turns the cyclic collector off for the fast path (its passes
    were 6% of ``status --head --json``'s CPU) and on again whichever way the command ends:
    an answer, a failure, or the CLI. Positive control: drop the ``finally`` in ``main`` and
    the collector stays off after the fast path's exit."""
    import gc

    from rayscope import __main__ as entry

    seen: list[bool] = []
    closed = f"127.0.0.1:{refused_port()}"
    with fake_head(planted()) as head:
        for argv in (["status", "--head", head.url], ["status", "--head", closed], ["--version"]):
            monkeypatch.setattr(sys, "argv", ["rayscope", *argv])
            with pytest.raises(SystemExit):
                entry.main()
            seen.append(gc.isenabled())
    capsys.readouterr()
    assert seen == [True, True, True] and head.requests
