"""Rule 5 of SECURITY.md: tokens behave like secrets.

A token file others can read is refused with the ``chmod`` that fixes it; a token that is not
one line of printable ASCII is refused in one line by every command that takes one, and no
part of a token is ever printed; ``bearer`` is accepted in any case; a read-only token
(``head --read-token-file``) reads ``/v1/status`` and ``/metrics`` and cannot send reports.
"""

import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rayscope.net import tokens
from tests.conftest import HeadDaemon, base_env, push_agent, run_rayscope
from tests.support import http_get
from tests.support.ports import HEAD_ON_PORT_0, refused_port
from tests.waiting import eventually

SECRET_LINES = (b"s3cr3t-first-line-AAAA", b"s3cr3t-second-line-BBBB")


def token_file(path: Path, content: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_token_file_open_to_others_is_refused_with_the_chmod(tmp_path: Path, mode: int) -> None:
    """Positive control: drop the ``st_mode`` check in ``tokens.read_token_file``."""
    path = token_file(tmp_path / "token", b"0123456789abcdef\n", mode)
    with pytest.raises(ValueError) as err:
        tokens.read_token_file(str(path))
    assert f"chmod 600 {path}" in str(err.value)
    assert "0123456789abcdef" not in str(err.value)


def test_a_private_token_file_is_read(tmp_path: Path) -> None:
    secret = b"secret token 0123456789"
    assert tokens.read_token_file(str(token_file(tmp_path / "t", b"  " + secret + b"\n"))) == secret
    assert tokens.read_token_file(None) == b""
    with pytest.raises(ValueError, match="is empty"):
        tokens.read_token_file(str(token_file(tmp_path / "empty", b"\n")))
    with pytest.raises(ValueError, match="No such file"):
        tokens.read_token_file(str(tmp_path / "missing"))


def test_a_token_shorter_than_16_bytes_is_refused_in_one_line(tmp_path: Path) -> None:
    """A head ran with a 1-byte token, which a throttled guesser still finds at
    once. Positive control: drop the length check in ``tokens.read_token_file``."""
    for size in (1, 8, 15):
        path = token_file(tmp_path / f"t{size}", b"k" * size + b"\n")
        with pytest.raises(ValueError) as err:
            tokens.read_token_file(str(path))
        said = str(err.value)
        assert said == (
            f"token file {path} holds a token of {size} bytes: a token has at least 16 ({tokens.MAKE_ONE})"
        )
    assert tokens.read_token_file(str(token_file(tmp_path / "t16", b"k" * 16 + b"\n"))) == b"k" * 16


BAD_TOKENS = {
    "two-lines": b"\n".join(SECRET_LINES) + b"\n",
    "binary": SECRET_LINES[0] + b"\xff\xfe\x00" + SECRET_LINES[1],
    "world-readable": SECRET_LINES[0],
    "short": SECRET_LINES[0][:8] + b"\n",  # 8 bytes: the review's probe ran a head on 1
}


def _commands(closed: int) -> dict[str, list[str]]:
    """Each command that takes a token, pointed at the closed port ``closed``; the head on
    ports the OS picks (it refuses the token before it binds them)."""
    url = f"http://127.0.0.1:{closed}"
    return {
        "status": ["status", "--head", url, "--timeout", "2"],
        "fit": ["fit", "--gpu-memory-mb", "100", "--head", url, "--timeout", "2"],
        "head": ["head", *HEAD_ON_PORT_0, "--gcs", f"127.0.0.1:{closed}"],
        "push": ["push", "--head", f"127.0.0.1:{closed}", "--node-id", "ab" * 28],
    }


@pytest.mark.parametrize("kind", sorted(BAD_TOKENS))
@pytest.mark.parametrize("command", ["status", "fit", "head", "push"])
def test_every_command_refuses_a_bad_token_in_one_line_and_never_prints_it(
    tmp_path: Path, kind: str, command: str
) -> None:
    """A two-line token once made ``status --head`` print the whole token in its error.
    Positive control: let ``tokens.read_token_file`` return any stripped content."""
    mode = 0o644 if kind == "world-readable" else 0o600
    path = token_file(tmp_path / "token", BAD_TOKENS[kind], mode)
    args = _commands(refused_port())[command]
    try:
        done = run_rayscope(*args, "--token-file", str(path), timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command} accepted the {kind} token and kept running")
    said = done.stdout + done.stderr
    for secret in SECRET_LINES:
        for i in range(0, len(secret) - 6):
            assert secret[i : i + 7].decode() not in said, f"part of the token printed: {said!r}"
    assert done.returncode == 2, said
    assert done.stderr.count("\n") == 1 and str(path) in done.stderr, said


def _get(url: str, authorization: str) -> int:
    return http_get.get(url, {"Authorization": authorization})[0]


def test_the_bearer_scheme_is_case_insensitive(head_daemon: HeadDaemon) -> None:
    """RFC 9110: the auth scheme is case-insensitive. Positive control: compare the header
    with ``b"Bearer " + token`` as it once was."""
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
        assert _get(head_daemon.url + "/v1/status", f"{scheme} {head_daemon.token}") == 200, scheme
    assert _get(head_daemon.url + "/v1/status", f"Basic {head_daemon.token}") == 401
    assert _get(head_daemon.url + "/v1/status", "Bearer wrong") == 401
    assert _get(head_daemon.url + "/v1/status", "Bearer \u00e9t\u00e9") == 401


def _health(head: HeadDaemon) -> dict[str, Any]:
    """``/healthz``: counters, and the scheduler view's age and the poller's state."""
    health: dict[str, Any] = msgspec.json.decode(head.get("/healthz")[1])
    return health


def test_a_read_only_token_reads_but_cannot_report(tmp_path: Path) -> None:
    """``head --read-token-file``: a dashboard's token reads ``/v1/status`` and ``/metrics``;
    an agent holding it is rejected on the report port. Positive control: add the read
    token to the report port's keys in ``Head.serve``."""
    write = token_file(tmp_path / "write", b"write-token-0123456789abcdef\n")
    read = token_file(tmp_path / "read", b"read-token-0123456789abcdef\n")
    env = base_env(RAY_AUTH_MODE="disabled")
    extra = ["--gcs", f"127.0.0.1:{refused_port()}", "--interval", "1", "--read-token-file", str(read)]
    head = HeadDaemon(env, tmp_path / "head.log", extra, write)
    try:
        for path in ("/v1/status", "/metrics"):
            assert head.get(path, token="read-token-0123456789abcdef")[0] == 200
            assert head.get(path, token="write-token-0123456789abcdef")[0] == 200
            assert head.get(path, token="other")[0] == 401
        agent = push_agent(head.listen_port, "cd" * 28, env, tmp_path / "push.log", read)
        try:
            eventually(lambda: _health(head)["frames_rejected"], 30, "the read token's frame rejected")
            health = _health(head)
            assert health["frames_rejected"] >= 1 and health["reports_received"] == 0, health
        finally:
            agent.stop()
    finally:
        head.stop()
    assert "read-token-0123456789abcdef" not in head.log_text()


def test_the_read_token_must_differ_from_the_write_token(tmp_path: Path) -> None:
    same = token_file(tmp_path / "same", b"one-token-for-both\n")
    done = run_rayscope(
        "head", *HEAD_ON_PORT_0, "--gcs", f"127.0.0.1:{refused_port()}",
        "--token-file", str(same), "--read-token-file", str(same), timeout=20,
    )  # fmt: skip
    assert done.returncode == 2 and "must differ" in done.stderr and done.stderr.count("\n") == 1
