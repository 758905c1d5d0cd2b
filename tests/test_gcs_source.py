"""The GCS source's pure parts: address rules, error wording, token auth set-up."""

from pathlib import Path

import pytest

from rayscope.errors import AgentError
from rayscope.net.addresses import parse_address, parse_gcs_address
from rayscope.node.collect import resolve_gcs
from rayscope.schema.report import RayletInfo
from rayscope.sources.gcs.address import ray_temp_dir, resolve_address
from rayscope.sources.gcs.read import prepare_auth_env
from rayscope.sources.gcs.reader import gcs_error_text


def raylet(gcs: str, pid: int = 10) -> RayletInfo:
    return RayletInfo(pid=pid, node_id="ab" * 28, node_ip="10.0.0.1", gcs_address=gcs)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10.0.0.1:6379", "10.0.0.1:6379"), (" head:6379 ", "head:6379"), ("[::1]:6379", "[::1]:6379")],
)
def test_parse_address_accepts(text: str, expected: str) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    "text", ["foo", ":6379", "host:", "host:0", "host:70000", "host:port", "a b:1", "http://x:1"]
)
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"HOST:PORT|port|host"):
        parse_address(text)


def test_resolution_order(tmp_path: Path) -> None:
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.4:6379\n")
    env: dict[str, str] = {"RAY_TMPDIR": str(tmp_path)}
    assert resolve_address(None, env, [])[0] == "10.0.0.4:6379"
    assert resolve_address(None, env, [raylet("10.0.0.3:6379")])[0] == "10.0.0.3:6379"
    env["RAYSCOPE_GCS"] = "10.0.0.2:6379"
    assert resolve_address(None, env, [raylet("10.0.0.3:6379")]) == ("10.0.0.2:6379", "RAYSCOPE_GCS")
    assert resolve_address("10.0.0.1:6379", env, []) == ("10.0.0.1:6379", "--gcs")


def test_ray_address_is_read_as_ray_reads_it(tmp_path: Path) -> None:
    """``$RAY_ADDRESS`` after ``--gcs`` and ``$RAYSCOPE_GCS``, before this host's raylets, as
    ``ray.init()`` reads it: ``HOST[:PORT]`` is the GCS (6379 by default), ``auto`` (and
    ``local``) means the cluster found here; a URL (``http://``: the Jobs CLI's dashboard
    address) is no GCS and is passed over. Before: ignored, the local raylet's read."""
    here = [raylet("10.0.0.3:6379")]
    env = {"RAY_TMPDIR": str(tmp_path)}
    assert resolve_address(None, {**env, "RAY_ADDRESS": "10.0.0.5:6380"}, here) == (
        "10.0.0.5:6380",
        "RAY_ADDRESS",
    )
    assert resolve_address(None, {**env, "RAY_ADDRESS": " 10.0.0.5 "}, here)[0] == "10.0.0.5:6379"
    for word in ("auto", "local", ""):
        assert resolve_address(None, {**env, "RAY_ADDRESS": word}, here)[0] == "10.0.0.3:6379"
    assert resolve_address(None, {**env, "RAY_ADDRESS": "http://10.0.0.5:8265"}, here)[0] == "10.0.0.3:6379"
    address, why = resolve_address(None, {**env, "RAY_ADDRESS": "http://10.0.0.5:8265"}, [])
    assert address is None and "RAY_ADDRESS=http://10.0.0.5:8265 is a dashboard URL" in why
    first = {**env, "RAY_ADDRESS": "10.0.0.5:6380", "RAYSCOPE_GCS": "10.0.0.2:6379"}
    assert resolve_address(None, first, here) == ("10.0.0.2:6379", "RAYSCOPE_GCS")
    assert resolve_address("10.0.0.1:6379", first, here) == ("10.0.0.1:6379", "--gcs")


def test_a_ray_client_address_says_where_the_gcs_usually_is() -> None:
    """``ray://HOST:10001`` is Ray Client's server, not the GCS. Before: ``give HOST:PORT
    without ray://``, which led to ``RpcError: Method not found!`` at port 10001."""
    with pytest.raises(ValueError) as err:
        parse_gcs_address("ray://10.0.0.1:10001")
    assert str(err.value) == (
        "'ray://10.0.0.1:10001' is a Ray Client address (ray.init's ray://; its server listens on"
        " 10001 by default), not the GCS: rayscope reads the GCS, usually 10.0.0.1:6379"
    )
    assert parse_gcs_address("10.0.0.1") == "10.0.0.1:6379"
    with pytest.raises(ValueError, match="without http://"):
        parse_gcs_address("http://10.0.0.1:6379")


def test_ray_address_of_ray_client_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    env = {"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": "ray://10.0.0.1:10001"}
    with pytest.raises(AgentError) as err:
        resolve_gcs(None, [raylet("10.0.0.3:6379")], env)
    assert err.value.exit_code == 2
    assert str(err.value).startswith(
        "bad GCS address from RAY_ADDRESS: 'ray://10.0.0.1:10001' is a Ray Client"
    )


def test_resolution_refuses_to_guess_between_clusters(tmp_path: Path) -> None:
    address, why = resolve_address(None, {"RAY_TMPDIR": str(tmp_path)}, [raylet("a:1", 1), raylet("b:2", 2)])
    assert address is None and "2 clusters" in why and "--gcs" in why


def test_resolution_says_what_to_do_when_nothing_names_a_cluster(tmp_path: Path) -> None:
    address, why = resolve_address(None, {"RAY_TMPDIR": str(tmp_path)}, [])
    assert address is None and "--gcs" in why and "RAYSCOPE_GCS" in why


def test_resolution_names_what_it_refused_and_the_option(tmp_path: Path) -> None:
    refused = "refused raylet pid 7: pid 7 runs as uid 1001, not as root or uid 0"
    address, why = resolve_address(None, {"RAY_TMPDIR": str(tmp_path)}, [], refused)
    assert address is None
    assert why == (
        "no GCS address: pass --gcs HOST:PORT or set RAYSCOPE_GCS"
        f" ({refused}; no ray_current_cluster file in {tmp_path / 'ray'})"
    )


def test_ray_temp_dir_follows_rays_rule() -> None:
    assert ray_temp_dir({}) == "/tmp/ray"
    assert ray_temp_dir({"TMPDIR": "/scratch"}) == "/scratch/ray"
    assert ray_temp_dir({"TMPDIR": "/scratch", "RAY_TMPDIR": "/r"}) == "/r/ray"


def test_gcs_errors_in_operator_words() -> None:
    assert gcs_error_text(TimeoutError(), "h:1", 5.0, None) == "GCS unreachable at h:1 (timeout 5 s)"
    unauth = RuntimeError("Unauthenticated: RPC error: InvalidAuthToken: Authentication token is missing")
    assert "requires token authentication" in gcs_error_text(unauth, "h:1", 5.0, None)
    rejected = gcs_error_text(unauth, "h:1", 5.0, "RAY_AUTH_TOKEN")
    assert rejected == "GCS at h:1 rejected the token from RAY_AUTH_TOKEN"
    assert gcs_error_text(RuntimeError("boom\nmore"), "h:1", 5.0, None) == "GCS at h:1 failed: boom"


def test_token_on_disk_turns_token_auth_on_like_ray_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    env: dict[str, str] = {}
    assert prepare_auth_env(env) is None and env == {}
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("secret")
    assert prepare_auth_env(env) is not None and env["RAY_AUTH_MODE"] == "token"
    explicit = {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x"}
    assert prepare_auth_env(explicit) == "RAY_AUTH_TOKEN" and explicit["RAY_AUTH_MODE"] == "disabled"


def test_cluster_state_reads_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rayscope.cluster_state()``'s docstring says ``$RAY_ADDRESS`` is read: it is. Before:
    ignored (this host's raylet, else ``no GCS address``)."""
    import rayscope
    from tests.support.ports import refused_port

    port = refused_port()
    monkeypatch.delenv("RAYSCOPE_GCS", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(rayscope.RayscopeError, match=f"127.0.0.1:{port}"):
        rayscope.cluster_state(timeout=2.0)
    monkeypatch.setenv("RAY_ADDRESS", "ray://127.0.0.1:10001")
    with pytest.raises(rayscope.RayscopeError, match="is a Ray Client address"):
        rayscope.cluster_state(timeout=2.0)
