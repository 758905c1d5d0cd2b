"""Ray token auth, live: a one-node cluster started with ``RAY_AUTH_MODE=token``."""

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveCluster, base_env, run_rayscope, start_cluster

pytestmark = pytest.mark.live

TOKEN = secrets.token_hex(16)


@pytest.fixture(scope="module")
def token_cluster() -> Iterator[LiveCluster]:
    cluster = start_cluster("single", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN})
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def test_without_token_the_error_says_what_to_set(token_cluster: LiveCluster, tmp_path: Path) -> None:
    env = base_env(HOME=str(tmp_path))  # no ~/.ray/auth_token, no RAY_AUTH_* at all
    done = run_rayscope("status", "--gcs", token_cluster.gcs_address, env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"rayscope: GCS at {token_cluster.gcs_address} requires token authentication:"
        " set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (and RAY_AUTH_MODE=token)"
    ]


def test_wrong_token_is_named(token_cluster: LiveCluster, tmp_path: Path) -> None:
    env = base_env(HOME=str(tmp_path), RAY_AUTH_TOKEN="0" * 32)
    done = run_rayscope("status", "--gcs", token_cluster.gcs_address, env=env)
    assert done.returncode == 2
    assert "rejected the token from RAY_AUTH_TOKEN" in done.stderr


@pytest.mark.parametrize("how", ["env", "path", "home"])
def test_token_from_env_path_or_home_reads_the_cluster(
    token_cluster: LiveCluster, tmp_path: Path, how: str
) -> None:
    env = base_env(HOME=str(tmp_path))
    if how == "env":
        env["RAY_AUTH_TOKEN"] = TOKEN
    elif how == "path":
        (tmp_path / "token").write_text(TOKEN)
        env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "token")
    else:  # like `ray start`: a token in ~/.ray/auth_token turns token auth on by itself
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text(TOKEN)
    done = run_rayscope("status", "--gcs", token_cluster.gcs_address, env=env)
    assert done.returncode == 0, done.stderr
    assert "  127.0.0.1 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: NA/NA GB  CPU: 8/8" in done.stdout
