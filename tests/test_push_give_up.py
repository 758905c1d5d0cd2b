"""``push`` against what retrying cannot fix: a bounded number of tries, one line, exit 2.

Before, ``push`` with no token, a wrong one, or ``--head`` at the head's HTTP port logged one
warning and retried for ever: systemd showed the unit active while it never reported. The
live cases run ``python -m rayscope push`` against a real ``rayscope head`` (``head_daemon``,
its GCS a closed port) and wait for it to exit; on the old code they time out. What retrying
can fix (the head away, a rejection that may pass: ``full``) is still retried: the unit
cases drive the agent's own send path with those failures many times over.
"""

import time
from pathlib import Path
from typing import Any

import pytest

from rayscope.errors import AgentError
from rayscope.net import peer, wire
from rayscope.node import give_up
from rayscope.node.push import Pusher
from rayscope.schema.report import NodeReport
from tests.conftest import push_once_a_second, run_rayscope, write_token

NODE_ID = "f" * 56
"""A whole node id: taken as given whatever raylets (other tests' clusters) run here."""
REPORT = NodeReport(node_id=NODE_ID, collected_at=1.0)


def push_until_it_exits(head: str, *extra: str, timeout_s: float = 60.0) -> tuple[int, list[str], float]:
    """Run ``push --head HEAD --interval 1``: (exit code, its stderr lines, seconds it ran)."""
    started = time.monotonic()
    done = run_rayscope(*push_once_a_second(head, NODE_ID, *extra), timeout=timeout_s)
    return done.returncode, done.stderr.splitlines(), time.monotonic() - started


def test_push_without_a_token_gives_up_with_one_line(head_daemon: Any) -> None:
    """Before: still retrying when killed (``subprocess.TimeoutExpired`` after 60 s)."""
    head = f"127.0.0.1:{head_daemon.listen_port}"
    code, lines, took = push_until_it_exits(head)
    why = "the head requires a token and this agent has none: pass --token-file (the head's file)"
    assert (code, lines[-1]) == (
        2,
        f"rayscope: head {head} rejected the report: {why}; gave up after 5 tries (retrying cannot fix it)",
    ), lines
    assert sum(why in line for line in lines) == 2, lines  # the warning once, then the last line
    assert took < 40, took  # 1 + 2 + 4 + 8 s of backoff, and the interpreter's start


def test_push_with_a_wrong_token_gives_up(head_daemon: Any, tmp_path: Path) -> None:
    head = f"127.0.0.1:{head_daemon.listen_port}"
    wrong = write_token(tmp_path / "wrong", "not-the-heads-token-0123456789")
    code, lines, _ = push_until_it_exits(head, "--token-file", str(wrong))
    assert code == 2 and lines[-1].endswith("gave up after 5 tries (retrying cannot fix it)"), lines
    assert "token rejected (bad token)" in lines[-1], lines


def test_push_at_the_http_port_gives_up(head_daemon: Any, wire_token: Path) -> None:
    head = f"127.0.0.1:{head_daemon.http_port}"
    code, lines, _ = push_until_it_exits(head, "--token-file", str(wire_token))
    assert (code, lines[-1]) == (
        2,
        f"rayscope: head {head} is a rayscope head's HTTP port (status, metrics; 7532 by default), not"
        " a head's report port: push --head wants the head's --listen address (7531 by default);"
        " gave up after 5 tries (retrying cannot fix it)",
    ), lines


def failing(monkeypatch: pytest.MonkeyPatch, connect: Any = None, rejected: str = "") -> Pusher:
    """A pusher whose every send fails: ``connect`` raises, or the head answers ``rejected``."""
    pusher = Pusher(("127.0.0.1", 9), b"t" * 32, 1.0)

    def connection() -> Any:
        if connect is not None:
            raise connect
        return object()

    monkeypatch.setattr(pusher, "_connection", connection)
    monkeypatch.setattr(pusher, "_read_acks", lambda wait_s: rejected or None)
    monkeypatch.setattr(pusher, "encode", lambda report: b"")
    return pusher


@pytest.mark.parametrize(
    "failure",
    [
        {"connect": ConnectionRefusedError(111, "Connection refused")},
        {"connect": TimeoutError("timed out")},
        {"rejected": wire.FULL},
        {"rejected": wire.CLAIMED},
    ],
    ids=["refused", "timed-out", "head-full", "claimed"],
)
def test_what_retrying_can_fix_is_retried_for_ever(monkeypatch: pytest.MonkeyPatch, failure: Any) -> None:
    pusher = failing(monkeypatch, **failure)
    assert [pusher.send(REPORT) for _ in range(4 * give_up.GIVE_UP_TRIES)] == [
        False
    ] * 4 * give_up.GIVE_UP_TRIES


@pytest.mark.parametrize(
    "failure",
    [{"rejected": wire.BAD_TOKEN}, {"connect": peer.WrongPort("is a gRPC port, not a head's report port")}],
    ids=["bad-token", "wrong-port"],
)
def test_what_retrying_cannot_fix_ends_on_the_last_try(monkeypatch: pytest.MonkeyPatch, failure: Any) -> None:
    pusher = failing(monkeypatch, **failure)
    for _ in range(give_up.GIVE_UP_TRIES - 1):
        assert pusher.send(REPORT) is False
    with pytest.raises(AgentError) as ended:
        pusher.send(REPORT)
    assert ended.value.exit_code == 2 and str(ended.value).startswith("head 127.0.0.1:9 ")


def test_a_report_taken_between_starts_the_count_again() -> None:
    hopeless = give_up.Hopeless(3)
    for _ in range(10):
        hopeless.again("x")
        hopeless.again("x")
        hopeless.reset()
    with pytest.raises(AgentError):
        for _ in range(3):
            hopeless.again("x")


def test_a_pusher_leaves_the_signal_handlers_as_it_found_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Pusher.run`` takes SIGTERM and SIGINT while it runs (the API embeds it): after it,
    Ctrl-C is the embedding program's again."""
    import signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    pusher = failing(monkeypatch, connect=ConnectionRefusedError(111, "Connection refused"))
    pusher.stop()
    pusher.run()
    assert {sig: signal.getsignal(sig) for sig in before} == before
