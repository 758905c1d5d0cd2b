"""The Ray dashboard as a source (agent/rayscope/sources/dashboard/): its parser against what each
Ray release answered (tests/data/dashboard/, written by ``python -m tests.tools.record_dashboard``
against a real ``ray start`` with the fake NVML), and its one GET against a local fake
dashboard that hangs, trickles, answers 500, garbage, too much, or wants a token.

Positive controls: read the answer with ``sock.settimeout(timeout_s)`` once instead of the
remaining time before each ``recv`` and :func:`test_a_trickling_dashboard_is_cut_at_the_deadline`
runs past its deadline; size the body from ``Content-Length`` and
:func:`test_a_huge_content_length_allocates_nothing` fails on its memory figure.
"""

import gc
import json
import socket
import ssl
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from rayscope.schema.dashboard import DashboardNode
from rayscope.sources import dashboard, listeners
from rayscope.sources.dashboard import get as dashboard_http
from rayscope.sources.gcs import raycompat
from rayscope.units import MIB
from tests import fake_nvml
from tests.support.dashboard import NODE_ID, FakeDashboard, answer, hangs, http, node
from tests.support.ports import refused_port

DATA = Path(__file__).resolve().parent / "data" / "dashboard"
RECORDED = sorted(DATA.glob("ray-*.json"))
URL = "http://127.0.0.1:8265"


def recorded(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def summary_body(doc: dict[str, Any], key: str = "summary") -> bytes:
    return json.dumps(doc[key]).encode()


def release(doc: dict[str, Any]) -> tuple[int, int]:
    major, minor = doc["ray"].split(".")[:2]
    return int(major), int(minor)


# --- what each release answered --------------------------------------------------------


def test_every_release_of_the_matrix_was_recorded() -> None:
    """The releases docs/dashboard.md describes, each recorded from a real dashboard."""
    assert {p.stem for p in RECORDED} >= {f"ray-{v}" for v in ("2.33.0", "2.40.0", "2.44.1", "2.60.0")}


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_a_recorded_summary_reads_every_gpu_in_bytes(path: Path) -> None:
    doc = recorded(path)
    nodes, status = dashboard.parse_summary(200, summary_body(doc), URL, doc["ray"])
    assert status.ok, status.reason
    [entry] = doc["summary"]["data"]["summary"]
    [node] = nodes.values()
    assert node.node_id == entry["raylet"]["nodeId"]
    assert node.node_ip == "127.0.0.1"
    assert node.measured_at == entry["now"]
    assert node.gpus is not None
    first, second = node.gpus
    # The fake's GPU 0: 7.0 GiB used + 0.3 GiB reserved; NVML's v1 "used" holds both, which
    # Ray reads and floors to MiB: 7475 MiB.
    assert (first.index, first.uuid, first.name) == (0, fake_nvml.uuid(0), fake_nvml.RTX_3090)
    assert (first.memory_used_bytes, first.memory_total_bytes) == (7475 * MIB, 24576 * MIB)
    assert (second.index, second.memory_used_bytes, second.processes) == (1, 307 * MIB, [])
    assert status.detail.startswith(f"{URL}: 1 node(s), 2 GPU(s)")


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_per_process_memory_and_its_belief_follow_the_release(path: Path) -> None:
    """The fake's GPU 0: the sleeper holds 1.2 GiB (compute) and 1.0 GiB (graphics), with a
    utilisation sample of SM 30 %, memory bus 50 %; a pid no host knows holds 0.5 GiB.

    * 2.33-2.49 list the sleeper once per NVML list: one entry here, its larger figure;
    * 2.50-2.56 take the sample's 50 % for half the GPU's 24 GiB (ray-project/ray#61456), and
      list only the sampled process: not believed;
    * 2.57 on read the lists again, the sleeper once (the graphics entry, Ray's last)."""
    doc = recorded(path)
    nodes, status = dashboard.parse_summary(200, summary_body(doc), URL, doc["ray"])
    [node] = nodes.values()
    assert node.gpus is not None
    processes = {p.pid: p.used_memory_bytes for p in node.gpus[0].processes}
    sleeper = int(doc["scenario"].split("gpu0.proc_util ")[1].split()[0])
    if release(doc) < (2, 50):
        expected = {sleeper: 1228 * MIB, fake_nvml.NO_SUCH_PID: 512 * MIB}
    elif release(doc) < (2, 57):
        expected = {sleeper: 12288 * MIB}
    else:
        expected = {sleeper: 1024 * MIB, fake_nvml.NO_SUCH_PID: 512 * MIB}
    assert processes == expected
    wrong = (2, 50) <= release(doc) < (2, 57)
    assert node.gpus[0].processes_believed is not wrong
    assert ("per-process memory not believed" in status.detail) is wrong


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_a_node_whose_agent_has_not_reported_has_no_gpus_yet(path: Path) -> None:
    doc = recorded(path)
    entries = doc["first"]["data"]["summary"]
    nodes, status = dashboard.parse_summary(200, summary_body(doc, "first"), URL, doc["ray"])
    assert status.ok and len(nodes) == len(entries)
    for entry in entries:
        node = nodes[entry["raylet"]["nodeId"]]
        assert (node.gpus is None) == ("gpus" not in entry)
        assert (node.measured_at is None) == ("now" not in entry)


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_the_published_address_is_where_the_dashboard_answered(path: Path) -> None:
    doc = recorded(path)
    assert doc["kv"]["webui:url"] == doc["kv"]["dashboard"]
    address, why = dashboard.choose_address(None, {}, doc["kv"]["webui:url"], "")
    assert address == dashboard.Address(f"http://{doc['kv']['webui:url']}", "GCS") and why == ""


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_an_error_answer_is_one_line_with_what_the_dashboard_said(path: Path) -> None:
    doc = recorded(path)
    bad = doc["bad_view"]
    nodes, status = dashboard.parse_summary(bad["status"], bad["body"].encode(), URL, doc["ray"])
    assert (nodes, status.ok) == ({}, False)
    assert status.reason == f"the Ray dashboard at {URL} answered HTTP 500: Unknown view nonsense"


def test_ray_2_33_to_2_51_need_a_user_agent_and_it_is_sent() -> None:
    """Recorded: up to 2.50.1 a request without ``User-Agent`` is answered 500 (2.52 on: 200)."""
    for path in RECORDED:
        doc = recorded(path)
        assert doc["no_user_agent"]["status"] == (500 if release(doc) < (2, 52) else 200), doc["ray"]
    request = dashboard_http._request(URL, None).decode()
    assert "\r\nUser-Agent: rayscope/" in request


TOKEN_RELEASES = [p for p in RECORDED if release(recorded(p)) >= (2, 52)]


@pytest.mark.parametrize("path", TOKEN_RELEASES, ids=lambda p: p.stem)
def test_every_token_release_takes_the_header_rayscope_sends(path: Path) -> None:
    """Under ``RAY_AUTH_MODE=token`` (2.52+): ``Authorization: Bearer`` (sent here) and
    ``X-Ray-Authorization: Bearer`` (KubeRay's) are taken; a bare token in either is 403;
    none is 401."""
    auth = recorded(path)["auth"]
    assert {way: answer["status"] for way, answer in auth.items()} == {
        "none": 401,
        "authorization_bearer": 200,
        "authorization_raw": 403,
        "x_ray_authorization_bearer": 200,
        "x_ray_authorization_raw": 403,
        "authorization_wrong": 403,
        "cookie": 200,
    }
    assert "\r\nAuthorization: Bearer tok\r\n" in dashboard_http._request(URL, b"tok").decode()


# --- a hostile answer --------------------------------------------------------------------


def parse(body: bytes, status: int = 200, version: str = "2.60.0") -> tuple[dict[str, DashboardNode], Any]:
    return dashboard.parse_summary(status, body, URL, version)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>proxy error</html>", "answered no node summary"),
        (b'{"result": true, "data": {"summary": {}}}', "answered no node summary"),
        (b'{"result": false, "msg": "busy\\u001b[31m"}', "answered: busy[31m"),
        (b"", "answered no node summary"),
    ],
)
def test_garbage_is_one_line_and_no_node(body: bytes, said: str) -> None:
    nodes, status = parse(body)
    assert nodes == {} and not status.ok and said in status.reason and "\n" not in status.reason


def test_a_500_without_json_says_its_first_line() -> None:
    _, status = parse(b"500 Internal Server Error\n\nServer got itself in trouble", status=500)
    assert status.reason == f"the Ray dashboard at {URL} answered HTTP 500: 500 Internal Server Error"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"memoryUsed": -1}, "Expected `int` >= 0"),
        ({"memoryUsed": 2**40}, "<= 17179869184"),
        ({"memoryUsed": "²"}, "not a number"),
        ({"memoryUsed": "1e3"}, "not a number"),
        ({"memoryUsed": 1e300}, "<= 17179869184"),
        ({"memoryUsed": True}, "Expected `int | float | str`"),
        ({"memoryUsed": None}, "Expected `int | float | str`"),
        ({"index": "0x1"}, "not a number"),
        ({"name": "x" * 300}, "length <= 256"),
        ({"processesPids": [{"pid": -4, "gpuMemoryUsage": 1}]}, "Expected `int` >= 0"),
        ({"processesPids": [{"pid": p, "gpuMemoryUsage": 1} for p in range(300)]}, "more than 256 processes"),
    ],
)
def test_a_node_that_breaks_a_rule_is_left_out_and_the_rest_stand(bad: dict[str, Any], why: str) -> None:
    good = node("cd" * 28)
    nodes, status = parse(answer(node(**bad), good))
    assert set(nodes) == {"cd" * 28}
    assert status.ok and "1 node(s) refused, first: " in status.detail and why in status.detail


@pytest.mark.parametrize(
    ("util", "pct"),
    [(87, 87), (0, 0), (99.6, 100), (101, None), (-1, None), ("87", None), (None, None), ([1], None)],
)
def test_the_gpu_utilisation_the_dashboard_sends_is_read(util: Any, pct: Optional[int]) -> None:
    """``utilizationGpu`` (every recorded release sends it): read, 0-100; one that is no such
    number costs the GPU its utilisation only, never its memory figures or the node.
    Before: every dashboard-measured GPU read ``util NA``."""
    nodes, status = parse(answer(node(memoryUsed=2048, utilizationGpu=util)))
    gpus = nodes[NODE_ID].gpus
    assert status.ok and gpus is not None and gpus[0].memory_used_bytes == 2048 * MIB
    assert gpus[0].utilization_gpu_pct == pct


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_every_recorded_release_gives_its_utilisation(path: Path) -> None:
    doc = recorded(path)
    nodes, _ = dashboard.parse_summary(200, summary_body(doc), URL, doc["ray"])
    sent = [g["utilizationGpu"] for n in doc["summary"]["data"]["summary"] for g in n.get("gpus") or []]
    read = [g.utilization_gpu_pct for n in nodes.values() for g in n.gpus or []]
    assert read == sent and sent


def test_a_fraction_of_a_mib_rounds_down() -> None:
    """Ray 2.50 writes per-process MiB as a float (``12288.0``, recorded)."""
    nodes, _ = parse(answer(node(memoryUsed=1.5, processesPids=[{"pid": 7, "gpuMemoryUsage": 12288.0}])))
    gpus = nodes[NODE_ID].gpus
    assert gpus is not None and gpus[0].memory_used_bytes == MIB + MIB // 2
    assert gpus[0].processes[0].used_memory_bytes == 12288 * MIB


def test_numbers_as_text_go_through_the_one_parser() -> None:
    nodes, _ = parse(answer(node(memoryUsed="2048", processesPids=[{"pid": "42", "gpuMemoryUsage": "7"}])))
    gpus = nodes[NODE_ID].gpus
    assert gpus is not None and gpus[0].memory_used_bytes == 2048 * MIB
    assert [(p.pid, p.used_memory_bytes) for p in gpus[0].processes] == [(42, 7 * MIB)]


def test_a_node_id_that_is_not_hex_and_a_node_listed_twice_are_refused() -> None:
    nodes, status = parse(answer(node("../../etc"), node(), node()))
    assert set(nodes) == {NODE_ID}
    assert "2 node(s) refused" in status.detail


def test_names_reach_no_terminal_with_controls() -> None:
    nodes, _ = parse(answer(node(name="T4\x1b]0;pwned\x07\u202e", uuid="GPU-\u200b1")))
    gpus = nodes[NODE_ID].gpus
    assert gpus is not None and (gpus[0].name, gpus[0].uuid) == ("T4]0;pwned", "GPU-1")


def test_a_negative_or_missing_now() -> None:
    bad = {**node(), "now": -1}
    missing = {k: v for k, v in node("cd" * 28).items() if k != "now"}
    nodes, status = parse(answer(bad, missing))
    assert set(nodes) == {"cd" * 28} and nodes["cd" * 28].measured_at is None
    assert "1 node(s) refused" in status.detail


@pytest.mark.parametrize(
    ("version", "believed"),
    [
        *[("2.33.0", True), ("2.49.2", True), ("2.50.0", False), ("2.56.1", False), ("2.57.0", True)],
        *[("2.60.0", True), (None, False), ("", False), ("2", False), ("two.x", False), ("2.⁵⁰", False)],
    ],
)
def test_which_releases_per_process_memory_is_believed(version: Optional[str], believed: bool) -> None:
    assert dashboard.believes_processes(version) is believed
    _, status = parse(answer(node()), version=version or "")
    assert ("per-process memory not believed" in status.detail) is not believed


# --- where the dashboard is --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("127.0.0.1:8265", "http://127.0.0.1:8265"),
        ("head", "http://head:8265"),
        ("http://head/", "http://head:8265"),
        ("https://proxy.example:443/ray/", "https://proxy.example:443/ray"),
        ("[::1]:9000", "http://[::1]:9000"),
        ("http://[::1]", "http://[::1]:8265"),
    ],
)
def test_a_dashboard_url(text: str, url: str) -> None:
    assert dashboard.parse_url(text) == url


@pytest.mark.parametrize(
    "text",
    [
        *["", "ftp://head", "http://user:pw@head", "http://head:0", "http://head:٢", "http://head:99999"],
        *[
            "http://head:1e3",
            "http://head/?x=1",
            "head name:80",
            "http://head\x1b:80",
            "http://" + "h" * 3000,
        ],
        *["http://hëad:80", "http://head/r\u2028ay"],
    ],
)
def test_not_a_dashboard_url(text: str) -> None:
    with pytest.raises(ValueError) as err:
        dashboard.parse_url(text)
    assert "\n" not in str(err.value)


def test_the_option_wins_then_the_environment_then_the_gcs() -> None:
    env = {dashboard.DASHBOARD_ENV: "envhost:1"}
    chosen = dashboard.choose_address("opt:2", env, "gcs:3", "")[0]
    assert chosen == dashboard.Address("http://opt:2", "--dashboard")
    assert dashboard.choose_address(None, env, "gcs:3", "")[0] == dashboard.Address(
        "http://envhost:1", "$RAYSCOPE_DASHBOARD"
    )
    assert dashboard.choose_address(None, {}, "gcs:3", "")[0] == dashboard.Address("http://gcs:3", "GCS")


def test_none_turns_the_source_off() -> None:
    assert dashboard.choose_address("none", {}, "gcs:3", "") == (None, "not read (--dashboard none)")
    off = dashboard.choose_address(None, {dashboard.DASHBOARD_ENV: "NONE"}, "gcs:3", "")
    assert off == (None, "not read ($RAYSCOPE_DASHBOARD none)")


def test_no_published_address_names_the_fix() -> None:
    address, why = dashboard.choose_address(None, {}, None, "the cluster published no dashboard address")
    assert address is None
    assert why == (
        "no Ray dashboard: the cluster published no dashboard address; install ray[default] on"
        " the head (its dashboard), or run a rayscope node agent"
    )


def test_an_operators_bad_url_is_an_error_and_a_published_one_a_reason() -> None:
    with pytest.raises(ValueError, match=r"^\$RAYSCOPE_DASHBOARD: "):
        dashboard.choose_address(None, {dashboard.DASHBOARD_ENV: "ftp://x"}, None, "")
    address, why = dashboard.choose_address(None, {}, "evil\x1b[2J:80/", "")
    assert address is None and "\x1b" not in why and "not one" in why


class FakeClient:
    """The GCS client's ``internal_kv_get`` over a dict (namespace, key) → value."""

    def __init__(self, kv: dict[tuple[bytes, bytes], bytes], fail: bool = False) -> None:
        self.kv, self.fail, self.asked = kv, fail, 0

    def internal_kv_get(self, key: bytes, namespace: bytes, timeout: float) -> Optional[bytes]:
        self.asked += 1
        if self.fail:
            raise RuntimeError("GCS said no")
        return self.kv.get((namespace, key))


def test_the_published_address_is_read_from_one_key_then_the_other() -> None:
    both = FakeClient({(b"dashboard", b"webui:url"): b"a:1", (b"dashboard", b"dashboard"): b"b:2"})
    assert raycompat.dashboard_url(both, 1.0) == ("a:1", "") and both.asked == 1
    assert raycompat.dashboard_url(FakeClient({(b"dashboard", b"dashboard"): b"b:2"}), 1.0) == ("b:2", "")
    none = (None, "the cluster published no dashboard address")
    assert raycompat.dashboard_url(FakeClient({}), 1.0) == none
    assert raycompat.dashboard_url(FakeClient({}, fail=True), 1.0)[0] is None
    huge = FakeClient({(b"dashboard", b"webui:url"): b"x" * 5000})
    assert raycompat.dashboard_url(huge, 1.0) == (None, "the published dashboard address is over 2048 bytes")


# --- Ray's token -------------------------------------------------------------------------


def test_the_token_is_found_where_ray_finds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dashboard.ray_token({}) == (None, "")
    assert dashboard.ray_token({"RAY_AUTH_TOKEN": " abc \n"}) == (b"abc", "RAY_AUTH_TOKEN")
    assert dashboard.ray_token({"RAY_AUTH_TOKEN": "abc", "RAY_AUTH_MODE": "disabled"}) == (None, "")
    path = tmp_path / "tok"
    path.write_text("fromfile\n")
    path.chmod(0o600)
    assert dashboard.ray_token({"RAY_AUTH_TOKEN_PATH": str(path)}) == (b"fromfile", "RAY_AUTH_TOKEN_PATH")
    (tmp_path / ".ray").mkdir()
    home_token = tmp_path / ".ray" / "auth_token"
    home_token.write_text("fromhome")
    home_token.chmod(0o600)
    assert dashboard.ray_token({}) == (b"fromhome", "~/.ray/auth_token")


def test_a_bad_token_is_one_line_that_never_shows_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^\$RAY_AUTH_TOKEN holds more than one line"):
        dashboard.ray_token({"RAY_AUTH_TOKEN": "secret\nsecond"})
    path = tmp_path / "tok"
    path.write_text("secret")
    path.chmod(0o646)
    with pytest.raises(ValueError, match="open to group or others") as err:
        dashboard.ray_token({"RAY_AUTH_TOKEN_PATH": str(path)})
    assert "secret" not in str(err.value)


def test_rays_own_token_file_is_taken_as_ray_writes_it(tmp_path: Path) -> None:
    """``ray get-auth-token --generate`` (Ray 2.60) writes ``~/.ray/auth_token`` mode 644."""
    path = tmp_path / "auth_token"
    path.write_text("a" * 64)
    path.chmod(0o644)
    assert dashboard.ray_token({"RAY_AUTH_TOKEN_PATH": str(path)}) == (b"a" * 64, "RAY_AUTH_TOKEN_PATH")


def test_a_published_address_on_another_host_gets_no_token() -> None:
    """Who listens there cannot be checked: naming it is the operator's way to allow it."""
    published = dashboard.Address("http://192.0.2.9:8265", "GCS")
    assert "not an address of this host" in dashboard.token_withheld(published)
    assert dashboard.token_withheld(dashboard.Address("http://192.0.2.9:8265", "--dashboard")) == ""


# --- the GET against a fake dashboard ----------------------------------------------------


def reply(data: bytes) -> Callable[[socket.socket, bytes], None]:
    return lambda conn, _request: conn.sendall(data)


def test_a_dashboard_read_over_the_socket(serving: Any) -> None:
    doc = recorded(DATA / "ray-2.60.0.json")
    server = serving(reply(http(200, summary_body(doc))))
    nodes, status = dashboard.read_nodes(dashboard.Address(server.url, "GCS"), 5.0, "2.60.0", {})
    assert status.ok and len(nodes) == 1
    [request] = server.requests
    assert request.startswith(b"GET /nodes?view=summary HTTP/1.0\r\n")
    assert b"Authorization" not in request


def test_a_path_prefix_is_kept(serving: Any) -> None:
    server = serving(reply(http(200, answer(node()))))
    dashboard_http.get(server.url + "/ray", None, 5.0)
    assert server.requests[0].startswith(b"GET /ray/nodes?view=summary HTTP/1.0\r\n")


def test_an_https_dashboard_is_read_and_its_tls_socket_closed(tmp_path: Path, monkeypatch: Any) -> None:
    """Read over TLS (the system's CAs: here a throwaway CA named by ``SSL_CERT_FILE``), and
    the TLS socket closed by the read, not left to the collector: a daemon reads the
    dashboard every interval. Positive control: close only the plain socket in
    ``dashboard_http.get`` (as before) and its ResourceWarning is seen."""
    from tests.support.pki import make_pki

    pki = make_pki(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["ca.pem"]))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki["head.pem"]), str(pki["head.key"]))
    server = FakeDashboard(reply(http(200, answer(node()))), context)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            status, body = dashboard_http.get(server.url, None, 5.0)
            gc.collect()
    finally:
        server.close()
    assert status == 200 and body == answer(node())
    assert server.requests[0].startswith(b"GET /nodes?view=summary HTTP/1.0\r\n")
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []


def test_a_dashboard_that_hangs_is_cut_at_the_deadline(serving: Any) -> None:
    server = serving(hangs)
    started = time.monotonic()
    _, status = dashboard.read_nodes(dashboard.Address(server.url, "GCS"), 0.5, "2.60.0", {})
    assert time.monotonic() - started < 1.5
    assert status.reason == f"the Ray dashboard at {server.url} did not answer in time (timeout 0.5 s)"


def test_a_trickling_dashboard_is_cut_at_the_deadline(serving: Any) -> None:
    """One byte every 0.1 s: each ``recv`` returns in time, the whole does not."""

    def trickle(conn: socket.socket, _request: bytes) -> None:
        for byte in http(200, b" " * 100):
            conn.sendall(bytes([byte]))
            time.sleep(0.1)

    server = serving(trickle)
    started = time.monotonic()
    with pytest.raises(dashboard_http.Unanswered, match="did not answer in time"):
        dashboard_http.get(server.url, None, 0.6)
    assert time.monotonic() - started < 1.2


def test_too_large_an_answer_is_refused_not_truncated(serving: Any) -> None:
    server = serving(reply(http(200, b"x" * 200_000)))
    with pytest.raises(dashboard_http.Unanswered, match="over the cap of 100,000 bytes"):
        dashboard_http.get(server.url, None, 5.0, max_bytes=100_000)


def test_too_large_an_answer_without_a_length_is_cut_at_the_cap(serving: Any) -> None:
    server = serving(reply(b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 200_000))
    with pytest.raises(dashboard_http.Unanswered, match="a body over the cap of 100,000 bytes"):
        dashboard_http.get(server.url, None, 5.0, max_bytes=100_000)


def test_a_huge_content_length_allocates_nothing(serving: Any) -> None:
    server = serving(reply(b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n{}"))
    tracemalloc.start()
    try:
        with pytest.raises(
            dashboard_http.Unanswered, match="Content-Length of 999,999,999,999 bytes, over the cap"
        ):
            dashboard_http.get(server.url, None, 5.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * MIB


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "is not an HTTP server"),
        (b"garbage\r\n\r\n{}", "is not an HTTP server"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}", "a body that ended before its length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n{}", "Transfer-Encoding other than chunked"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n\x1f\x8b", "Content-Encoding that was not asked"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}",
            "two Content-Length headers",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}", "Content-Length that is not a number"),
        (b"HTTP/1.1 2\xb20 OK\r\n\r\n{}", "status code that is not a number"),
        (b"", "failed: remote end closed connection without response"),
    ],
)
def test_what_is_not_a_plain_http_answer(serving: Any, data: bytes, said: str) -> None:
    server = serving(reply(data))
    with pytest.raises(dashboard_http.Unanswered, match=said):
        dashboard_http.get(server.url, None, 5.0)


def test_a_chunked_answer_is_read_by_the_one_bounded_reader(serving: Any) -> None:
    """The dashboard's transport is the head client's (one reader): a chunked answer is read,
    not refused, and its size is capped like any other."""
    server = serving(reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"))
    assert dashboard_http.get(server.url, None, 5.0) == (200, b"{}")
    server = serving(
        reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n30d41\r\n" + b"x" * 200_001)
    )
    with pytest.raises(dashboard_http.Unanswered, match="a chunked body over the cap"):
        dashboard_http.get(server.url, None, 5.0, max_bytes=100_000)


def test_a_closed_port_is_connection_refused() -> None:
    port = refused_port()
    _, status = dashboard.read_nodes(dashboard.Address(f"http://127.0.0.1:{port}", "GCS"), 2.0, None, {})
    assert status.reason == f"no Ray dashboard at http://127.0.0.1:{port} (connection refused)"


def token_dashboard(token: bytes) -> Callable[[socket.socket, bytes], None]:
    """Ray 2.52+'s rule (recorded): no header 401, a wrong token 403, the right one 200."""

    def serve(conn: socket.socket, request: bytes) -> None:
        if b"\r\nAuthorization: Bearer " not in request:
            conn.sendall(http(401, b"Unauthorized: Missing authentication token"))
        elif f"\r\nAuthorization: Bearer {token.decode()}\r\n".encode() not in request:
            conn.sendall(http(403, b"Forbidden: Invalid authentication token"))
        else:
            conn.sendall(http(200, answer(node())))

    return serve


def test_a_dashboard_that_wants_a_token(serving: Any) -> None:
    server = serving(token_dashboard(b"s3cret"))
    address = dashboard.Address(server.url, "GCS")
    nodes, status = dashboard.read_nodes(address, 5.0, "2.60.0", {"RAY_AUTH_TOKEN": "s3cret"})
    assert status.ok and set(nodes) == {NODE_ID}
    _, status = dashboard.read_nodes(address, 5.0, "2.60.0", {"RAY_AUTH_MODE": "disabled"})
    assert status.reason == (
        f"the Ray dashboard at {server.url} requires a token: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
    )
    _, status = dashboard.read_nodes(address, 5.0, "2.60.0", {"RAY_AUTH_TOKEN": "wrong"})
    assert status.reason == f"the Ray dashboard at {server.url} rejected the token from RAY_AUTH_TOKEN"
    assert all(b"s3cret" not in r for r in server.requests[1:])


def test_the_token_is_withheld_from_a_published_dashboard_on_another_host(
    serving: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read all the same, without the token; the 401 says why and what to pass."""
    server = serving(token_dashboard(b"s3cret"))
    address = dashboard.Address(server.url, "GCS")
    monkeypatch.setattr(listeners, "is_here", lambda _ip: False)  # as if 127.0.0.1 were elsewhere
    _, status = dashboard.read_nodes(address, 5.0, "2.60.0", {"RAY_AUTH_TOKEN": "s3cret"})
    assert status.reason == (
        f"the Ray dashboard at {server.url} requires a token: the one from RAY_AUTH_TOKEN was withheld"
        " (127.0.0.1 is not an address of this host: who listens there cannot be checked); to send it,"
        f" name this dashboard: --dashboard {server.url} (or $RAYSCOPE_DASHBOARD)"
    )
    assert server.requests and b"s3cret" not in server.requests[0]
