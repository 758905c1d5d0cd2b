"""``status --watch``: what is highlighted (pure), the frame loop (recorded states, a fake
screen), and the real thing in a pseudo-terminal against the live cluster: frames redraw in
place, a booking made meanwhile lights up, Ctrl-C leaves the terminal as it was."""

import contextlib
import io
import os
import re
import signal
import sys
import termios
import time
from pathlib import Path
from typing import Any, Callable

import msgspec
import pexpect
import pytest

from rayscope.cli import watch
from rayscope.cli.argv import optional_watch_value
from rayscope.errors import AgentError
from rayscope.render.status import status_lines
from rayscope.render.watch import HIGHLIGHT_OFF, HIGHLIGHT_ON, fit_screen, highlight_changes
from rayscope.schema.status import ClusterStatus
from tests.conftest import REPO, LiveCluster
from tests.scenarios import T4, seed_status

ON, OFF = HIGHLIGHT_ON, HIGHLIGHT_OFF


def test_first_frame_has_no_highlight() -> None:
    lines = status_lines(seed_status())
    assert highlight_changes(None, lines) == lines


def test_only_the_changed_value_is_highlighted() -> None:
    before = status_lines(seed_status())
    status = seed_status()
    t4 = msgspec.structs.replace(status.nodes[T4], used_gpu=0.58)
    after = status_lines(msgspec.structs.replace(status, nodes={**status.nodes, T4: t4}))
    marked = highlight_changes(before, after)
    assert marked[4] == f"  10.0.0.5 [worker] T4 GPU: {ON}0.58{OFF}/1 VRAM: 5.8/24.0 GB  CPU: 6/8"
    assert [line for line in marked if ON in line] == [marked[4]]


def test_a_new_node_lights_up_whole_and_shifts_nothing_else() -> None:
    before = ["Cluster: 2/8 CPUs", "", "CPU-only nodes:", "  10.0.0.7 [worker] CPU: 2/16"]
    after = [*before[:3], "  10.0.0.6 [worker] CPU: 0/4", before[3]]
    assert highlight_changes(before, after) == [
        *before[:3],
        f"{ON}  10.0.0.6 [worker] CPU: 0/4{OFF}",
        before[3],
    ]


def test_screen_cut_never_wraps() -> None:
    assert fit_screen(["x" * 30, "y", "z"], columns=10, rows=2) == ["x" * 8 + " \u2026", "y"]


SEED_HEAD = "  127.0.0.1 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: NA/NA GB  CPU: 8/8"


def test_the_seeds_81_column_head_line_is_cut_at_a_field_with_a_marker() -> None:
    """Before: ``line[:80]``, which ends ``CPU: 8/`` (a number cut in half, as if 8 of
    nothing). Now the field that does not fit goes whole, and the line says it was cut."""
    assert len(SEED_HEAD) == 81
    assert fit_screen([SEED_HEAD], columns=80, rows=5) == [
        "  127.0.0.1 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: NA/NA GB \u2026"
    ]
    assert fit_screen([SEED_HEAD], columns=81, rows=5) == [SEED_HEAD]


@pytest.mark.parametrize("columns", range(20, 81))
def test_no_width_cuts_a_number_or_a_field_in_half(columns: int) -> None:
    """At every width: the line fits, ends with the marker after a space, and what is kept
    is whole fields of the line (a prefix that ends where a field ends)."""
    (cut,) = fit_screen([SEED_HEAD], columns=columns, rows=1, marker=">")
    kept = cut[: -len(" >")]
    assert len(cut) <= columns and cut.endswith(" >")
    assert SEED_HEAD.startswith(kept) and SEED_HEAD[len(kept)] == " ", (columns, cut)
    assert not kept.endswith((":", "/")), (columns, cut)


def test_an_error_line_is_wrapped_whole_not_cut() -> None:
    from rayscope.render.watch import wrap_to

    error = "rayscope: GCS unreachable at 10.0.0.1:6379 (timeout 5 s) (retrying every 2 s)"
    wrapped = wrap_to(error, 40)
    assert all(len(line) <= 40 for line in wrapped) and " ".join(wrapped) == error


def watched(read: Callable[[], ClusterStatus], frames: int) -> tuple[int, str]:
    """``watch.run`` of ``read`` for ``frames`` frames on a 120x40 screen, without sleeping:
    its exit code and what it drew."""
    screen = io.StringIO()
    code = watch.run(
        read,
        status_lines,
        2.0,
        stream=screen,
        frames=frames,
        sleep=lambda s: None,
        screen_size=lambda: os.terminal_size((120, 40)),
    )
    return code, screen.getvalue()


def test_a_failed_reads_peer_text_reaches_the_screen_printable() -> None:
    """An error may quote a peer (Ray's first line, a head's answer): before, it was drawn as
    it came, escape sequences included (here one that retitles the terminal)."""

    def read() -> ClusterStatus:
        raise AgentError("GCS at x:1 failed: \x1b]0;owned\x07boom", 2)

    _, out = watched(read, frames=1)
    assert "\x1b]0;" not in out and "\x07" not in out
    assert "GCS at x:1 failed: ]0;ownedboom (retrying every 2 s)" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["status", "--watch"], ["status", "--watch", "2"]),
        (["status", "--watch", "0.5"], ["status", "--watch", "0.5"]),
        (["status", "--watch", "--all"], ["status", "--watch", "2", "--all"]),
        (["status", "--watch=3"], ["status", "--watch=3"]),
        (["status", "--", "--watch"], ["status", "--", "--watch"]),
    ],
)
def test_bare_watch_means_every_2_s(argv: list[str], expected: list[str]) -> None:
    assert optional_watch_value(argv) == expected


def test_loop_draws_frames_in_place_and_survives_a_failed_read() -> None:
    """Three frames on a fake screen: good, unreachable, changed — each one write, over the last."""
    changed = seed_status()
    changed.nodes[T4] = msgspec.structs.replace(changed.nodes[T4], used_gpu=0.58)
    answers: list[object] = [
        seed_status(),
        AgentError("GCS unreachable at x:1 (connection refused)", 2),
        changed,
    ]

    def read() -> ClusterStatus:
        answer = answers.pop(0)
        if isinstance(answer, AgentError):
            raise answer
        assert isinstance(answer, ClusterStatus)
        return answer

    code, out = watched(read, frames=3)
    assert code == 0
    assert out.startswith(watch.ENTER) and out.endswith(watch.LEAVE)
    frames = out[len(watch.ENTER) : -len(watch.LEAVE)].split(watch.HOME)[1:]
    assert len(frames) == 3 and all(f.endswith(watch.CLEAR_BELOW) for f in frames)
    assert "rayscope: GCS unreachable at x:1 (connection refused) (retrying every 2 s)" in frames[1]
    assert "GPU: 0.99/1" in frames[1]  # the last good frame stays under the error
    assert f"GPU: {ON}0.58{OFF}/1" in frames[2] and ON not in frames[0]


# --- live, in a pseudo-terminal ------------------------------------------------------------

FRAME = re.compile(r"\x1b\[H(.*?)\x1b\[J", re.DOTALL)


@pytest.mark.live
def test_watch_in_a_terminal(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    # PYTHONFAULTHANDLER: a watch that outlives Ctrl-C is sent SIGABRT and prints where each
    # of its threads was (seen once under CI's load, never alone: the dump says why).
    env = {**rayscope_env, "TERM": "xterm", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    script = (
        "stty -g; "
        f"{sys.executable} -m rayscope status --watch 0.5 --gcs {live_cluster.gcs_address}; "
        'echo "EXIT=$?"; stty -g'
    )
    child = pexpect.spawn(
        "/bin/bash",
        ["--norc", "--noprofile", "-c", script],
        cwd=str(REPO),
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 140),
    )
    try:
        child.expect(r"(\S+)\r\n")
        before = child.match.group(1)
        child.expect_exact(watch.ENTER)
        frames = []
        for _ in range(3):
            child.expect(FRAME)
            frames.append(child.match.group(1))
        # While watching, keys typed do not echo into the frame.
        assert not termios_echo(child)
        assert "127.0.0.1 [worker] T4 GPU: 0.33/1" in frames[-1] and ON not in frames[-1]

        live_cluster.request(
            op="actor", name="watch-probe", node="denbi", options={"num_gpus": 0.25, "num_cpus": 0}
        )
        try:
            child.expect(re.escape(f"T4 GPU: {ON}0.58{OFF}/1"))
            child.expect(FRAME)  # the frame after: nothing changed, nothing lit
            assert "T4 GPU: 0.58/1" in child.match.group(1) and ON not in child.match.group(1)
        finally:
            live_cluster.request(op="kill_actor", name="watch-probe")
        child.expect(re.escape(f"T4 GPU: {ON}0.33{OFF}/1"))

        started = time.monotonic()
        child.sendintr()
        left = child.expect_exact([watch.LEAVE, pexpect.TIMEOUT], timeout=30)
        assert left == 0, f"Ctrl-C did not end the watch within 30 s:\n{stuck_watch(child)}"
        child.expect(r"EXIT=(\d+)\r\n")
        assert child.match.group(1) == "0"
        child.expect(r"(\S+)\r\n")
        assert child.match.group(1) == before  # stty -g: every terminal setting as it was
        assert time.monotonic() - started < 10
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def stuck_watch(child: Any) -> str:
    """What a watch that did not end was doing: its processes (state, kernel wait) and, after
    SIGABRT, the Python stack of each of its threads (faulthandler, on the terminal)."""
    import psutil

    shell = psutil.Process(child.pid)
    tree = [shell, *shell.children(recursive=True)]
    rows, watcher = [], None
    for proc in tree:
        with contextlib.suppress(psutil.Error, OSError):
            argv, wchan = proc.cmdline(), Path(f"/proc/{proc.pid}/wchan").read_text()
            rows.append(f"{proc.pid} {proc.status()} {wchan} {' '.join(argv)[:160]}")
            watcher = proc if "--watch" in argv else watcher
    if watcher is not None:
        watcher.send_signal(signal.SIGABRT)
        with contextlib.suppress(pexpect.TIMEOUT, pexpect.EOF):
            child.expect(pexpect.EOF, timeout=10)
    return "\n".join(rows) + "\n" + str(child.before)[-6000:]


def termios_echo(child: Any) -> bool:
    """ECHO as the child's terminal has it (a pty master shares the slave's settings)."""
    return bool(termios.tcgetattr(child.child_fd)[3] & termios.ECHO)
