"""rayscope's threads (:class:`rayscope.errors.Worker`): what one raises is kept for its owner, never
printed, not even while the interpreter shuts down (a daemon thread printing then aborted
Python 3.13 after Ctrl-C on ``status --watch``); and every thread of ours is one."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from rayscope import errors
from rayscope.sources.nvml.devices import BoundedRead
from tests.conftest import REPO

AGENT = REPO / "agent" / "rayscope"

# A thread still running when the main thread ends, which raises while Python shuts down
# (the atexit hook lets it go, and waits for it to have said what it would say).
AT_EXIT = """
import atexit, sys, threading
sys.path.insert(0, {agent!r})
from rayscope import errors

go = threading.Event()

def read():
    go.wait()
    raise ValueError("a read given up at its deadline, failing during shutdown")

thread = {start}
atexit.register(lambda: (go.set(), thread.join(5)))
print("done")
"""


@pytest.mark.parametrize(
    ("start", "printed"),
    [
        ('threading.Thread(target=read, name="plain", daemon=True); thread.start()', True),
        ('errors.start_worker(read, "rayscope-read")', False),
    ],
    ids=["plain-thread-prints", "worker-is-quiet"],
)
def test_a_thread_failing_at_shutdown_prints_nothing(start: str, printed: bool) -> None:
    """The plain thread is the control: the same program prints its traceback on stderr."""
    script = AT_EXIT.format(agent=str(REPO / "agent"), start=start)
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "done\n", done
    assert ("ValueError" in done.stderr) is printed, done.stderr


def test_a_worker_keeps_what_it_raised(capfd: pytest.CaptureFixture[str]) -> None:
    def fail() -> None:
        raise KeyError("k")

    worker = errors.start_worker(fail, "rayscope-test")
    worker.join(10)
    assert isinstance(worker.error, KeyError) and not worker.is_alive() and worker.daemon
    assert capfd.readouterr().err == ""
    done = errors.start_worker(lambda: None, "rayscope-test")
    done.join(10)
    assert done.error is None


def test_a_bounded_nvml_read_that_raises_is_a_failed_source_not_a_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    def broken() -> None:
        raise RuntimeError("a bug in the read")

    gpus, host, status = BoundedRead(broken)(timeout_s=10)  # type: ignore[arg-type]
    assert (gpus, host, status.ok) == (None, None, False)
    assert "RuntimeError" in status.reason and "timed out" not in status.reason
    assert capfd.readouterr().err == ""


def thread_starts(path: Path) -> list[int]:
    """Lines of ``path`` that make a ``threading.Thread`` or a subclass of it."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Thread":
            found.append(node.lineno)
        if isinstance(node, ast.ClassDef) and any(
            ast.unparse(base) in ("threading.Thread", "Thread") for base in node.bases
        ):
            found.append(node.lineno)
    return sorted(found)


def test_every_thread_of_rayscope_is_a_worker() -> None:
    """Only ``rayscope/errors.py`` (:class:`~rayscope.errors.Worker`) makes a
    ``threading.Thread`` (the head's HTTP pool is ``concurrent.futures``', which keeps what a
    task raises in its future)."""
    made = {
        str(path.relative_to(AGENT)): lines
        for path in sorted(AGENT.rglob("*.py"))
        if (lines := thread_starts(path)) and path != AGENT / "errors.py"
    }
    assert made == {}


def test_the_rule_finds_a_thread(tmp_path: Path) -> None:
    """The check above can fail."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import threading\nt = threading.Thread(target=print)\nclass T(threading.Thread): pass\n"
    )
    assert thread_starts(sample) == [2, 3]
