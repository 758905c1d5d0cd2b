"""The head's page in a real browser: Debian's Chromium, headless, against a real head on the
live seed cluster with fake-NVML agents (tests/browser.py drives it over DevTools).

One ``rayscope head`` with the agents' token and a read token; ``rayscope push`` on the head
node (its RTX 3090 held by the four federated-unet replicas and a process outside Ray) and on
the CPU node; the deNBI T4 has no agent. The browser gets the login form, logs in with the
read token, and the page then shows per GPU the numbers of ``/v1/status?gpus=1``; it
refreshes itself; every request it made went to the head (DevTools' log and Chromium's own
network log agree). Another site (``localhost``, a second origin on loopback) can neither log
the browser in nor make it send its session; another port of the head's own host (where Ray's
dashboard or Grafana listen) receives nothing of the login that, replayed, opens the page.

``RAYSCOPE_PAGE_PNG=docs/page.png`` keeps the screenshot (the README's picture), and beside it
the page whole at 1,400 and 700 pixels (``page-1400.png``, ``page-700.png``), the two widths
its layout is checked at: a one-GPU node's bar spans its node, the legend's keys sit
on their words' line, no app line of "Bookings beside use" is cut, the unmeasured deNBI node
says why (its badge).

Positive controls: serving the page without the CSP and with a CDN stylesheet fails the
network-log check (the stylesheet's request has the page's isolation key); the evil page's
own requests to the head are caught by the same check (asserted below); keeping the session in
a cookie again (the code before this rule) lets the other port replay it: the page, 200.
"""

import http.server
import json
import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import pytest

from tests import fake_nvml as fake
from tests.browser import CHROMIUM, Browser, net_log_requests
from tests.conftest import Daemon, HeadDaemon, LiveCluster, base_env, push_agent
from tests.support import fake_server, http_get
from tests.support.page import BADGES, LAYOUT, cells
from tests.support.ports import refused_port

pytestmark = pytest.mark.live

MEASURED_GIB = {
    "federated-unet-0": 5.4,
    "federated-unet-1": 4.9,
    "federated-unet-2": 5.0,
    "federated-unet-3": 4.8,
}
OUTSIDE_GIB = 1.2
DEVICE_USED_GIB = 22.5
READ_TOKEN = "read-token-for-the-page-0123456789"
READY_S = 90.0


def scenario(pids: dict[str, int], outsider: int) -> str:
    measured = {pids[name]: gib for name, gib in MEASURED_GIB.items()}
    return fake.rtx_3090_scenario(DEVICE_USED_GIB, {**measured, outsider: OUTSIDE_GIB})


class Paged(NamedTuple):
    head: HeadDaemon
    cluster: LiveCluster
    status: dict[str, Any]
    """``/v1/status?gpus=1`` once the head's GPU is attributed."""


@pytest.fixture(scope="module")
def paged(
    live_cluster: LiveCluster,
    fake_nvml_lib: fake.FakeNvml,
    wire_token: Path,
    sleeper: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Paged]:
    root = tmp_path_factory.mktemp("page")
    pids = {a["name"]: a["pid"] for a in live_cluster.state["actors"]}
    (root / "nvml.txt").write_text(scenario(pids, sleeper))
    read = root / "read-token"
    read.write_text(READ_TOKEN + "\n")
    read.chmod(0o600)
    env = fake_nvml_lib.env(
        base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(live_cluster.root)), root / "nvml.txt"
    )
    extra = ["--gcs", live_cluster.gcs_address, "--interval", "1", "--read-token-file", str(read)]
    head = HeadDaemon(env, root / "head.log", extra, wire_token)
    agents: list[Daemon] = []
    try:
        for name in ("head", "cpu"):
            agents.append(
                push_agent(
                    head.listen_port, live_cluster.node_id(name), env, root / f"{name}.log", wire_token
                )
            )
        deadline = time.monotonic() + READY_S
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            code, body = head.get("/v1/status?gpus=1", token=READ_TOKEN)
            status = json.loads(body) if code == 200 else {}
            node = status.get("nodes", {}).get(live_cluster.node_id("head"), {})
            gpus = node.get("gpus") or []
            if (
                gpus
                and gpus[0].get("attribution", {}).get("booked_actors") == 4
                and node.get("agent") == "reporting"
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the head never attributed its GPU: {status}\n{head.log_text()[-3000:]}")
        yield Paged(head, live_cluster, status)
    finally:
        for agent in agents:
            agent.stop()
        head.stop()


def expected_cells(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """Per GPU cell, from the served document: booked, fraction, measured as the page writes
    them (``VRAM_MB`` on a node that has it, the fraction elsewhere; NVML in GiB)."""
    out = {}
    for node_id, node in status["nodes"].items():
        if node["total_gpu"] <= 0:
            continue
        devices = (node.get("placement") or {}).get("devices") or []
        for device in devices:
            key = (
                f"{node_id}:{device['nvml_index']}"
                if node.get("gpus")
                else f"{node_id}:ray{device['gpu_id']}"
            )
            total = device.get("memory_total_bytes")
            used = device.get("memory_used_bytes")
            if node["total_vram_mb"] > 0:
                booked = f"{device['booked_vram_mb']:.0f}/{total / 2**20:.0f} MB"
            else:
                booked = f"{device['booked_gpu']:.2f} GPU"
            measured = f"{gib(used)}/{gib(total)} GB"
            out[key] = (booked, f"{device['booked_gpu']:.2f}", measured)
    return out


def gib(value: Any) -> str:
    return "NA" if value is None else f"{value / 2**30:.1f}"


PAGE_SHOWN = "document.querySelector('#view .totals') !== null && !document.querySelector('form.login')"
"""The page's view is in the tab (served whole, or read by its script with the tab's session)."""


def log_in(browser: Browser, head: HeadDaemon, token: str) -> None:
    """The form filled and sent as an operator does; back when the page shows."""
    browser.navigate(head.url + "/")
    browser.evaluate(f"document.querySelector('input[name=token]').value = {json.dumps(token)}")
    browser.evaluate("document.querySelector('form.login').submit()")
    browser.wait_for(PAGE_SHOWN)


def session_kept(browser: Browser) -> str:
    """The session the login left in this tab for the head's origin (none: ``""``)."""
    return str(browser.evaluate("sessionStorage.getItem('rayscope_session') || ''"))


def test_the_page_in_chromium_shows_every_gpus_numbers_and_asks_only_the_head(
    paged: Paged, tmp_path: Path
) -> None:
    head, cluster = paged.head, paged.cluster
    europa, denbi = cluster.node_id("head"), cluster.node_id("denbi")
    browser = Browser(tmp_path, width=1000, height=700)
    try:
        browser.navigate(head.url + "/")
        assert browser.responses()[0] == (head.url + "/", 401)
        assert "data-gpu" not in browser.dom()  # the login form, no cluster
        log_in(browser, head, READ_TOKEN)
        assert browser.page("Network.getCookies", urls=[head.url])["cookies"] == []  # no cookie
        kept = session_kept(browser)
        assert kept and READ_TOKEN not in kept  # the tab's session: a MAC, never the token
        found = cells(browser.dom())
        expected = expected_cells(paged.status)
        assert set(expected) == {f"{europa}:0", f"{denbi}:ray0"}
        for key, (booked, fraction, measured) in expected.items():
            assert (found[key]["booked"], found[key]["fraction"], found[key]["measured"]) == (
                [booked],
                [fraction],
                [measured],
            ), key
        # The seed's numbers, as the README's status lines give them.
        assert expected[f"{europa}:0"][:2] == ("20480/24576 MB", "0.04")
        assert expected[f"{denbi}:ray0"][:2] == ("0.33 GPU", "0.33")
        hover = "\n".join(found[f"{europa}:0"]["title"])
        for name, gib_used in MEASURED_GIB.items():  # each actor's name on hover
            line = f"{name}#[0-9a-f]{{4}}: booked 5120 MB VRAM_MB [+] GPU 0.01, uses {gib_used}"
            assert re.search(line, hover), (line, hover)
        assert "over booking" in found[f"{europa}:0"]["mark"]  # 5.4 GiB held on a 5120 MB booking
        text = browser.evaluate("document.body.innerText")
        assert "booked: 20480/24576 MB" in text and "no agent" in text
        # It refreshes itself: the fragment comes back 200 and the numbers stay.
        since = len(browser.events)
        event = browser.wait_event("Network.responseReceived", since, timeout_s=15)
        while "fragment=1" not in event["params"]["response"]["url"]:
            since = browser.events.index(event) + 1
            event = browser.wait_event("Network.responseReceived", since, timeout_s=15)
        assert event["params"]["response"]["status"] == 200
        browser.wait_for("document.getElementById('age').textContent.startsWith('updated')")
        assert cells(browser.dom())[f"{europa}:0"]["booked"] == ["20480/24576 MB"]
        png = tmp_path / "page.png"
        browser.screenshot(png)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        keep_png = os.environ.get("RAYSCOPE_PAGE_PNG")
        if keep_png:
            shutil.copyfile(png, keep_png)
        assert browser.evaluate(BADGES) == [["no agent", denbi]]
        for width in (1400, 700):
            browser.at_width(width)
            laid = browser.evaluate(LAYOUT)
            assert laid["bar"] > 0.9 * laid["node"], (width, laid)  # the width used (was 380 px at most)
            assert laid["keys_off"] == [], (width, laid)  # each legend item one line, its key beside it
            assert laid["cut"] == [], (width, laid)  # nothing cut with an ellipsis in the apps
            whole = tmp_path / f"page-{width}.png"
            browser.screenshot_whole(whole, width)
            assert whole.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            if keep_png:
                shutil.copyfile(whole, Path(keep_png).with_name(f"page-{width}.png"))
        asked = browser.requested_urls()
    finally:
        browser.close()
    assert asked and all(url.startswith(head.url + "/") for url in asked), asked
    page_asked = net_log_requests(browser.net_log, page_site="http://127.0.0.1")
    assert any("fragment=1" in url for url in page_asked)
    assert all(url.startswith(head.url + "/") for url in page_asked), page_asked


class Page(http.server.BaseHTTPRequestHandler):
    """A site of its own beside the head's: :meth:`send_page` answers with HTML; nothing logged."""

    def send_page(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Evil(Page):
    """Another site (``http://localhost:PORT``): a form that posts the token to the head's
    login, an image that GETs the login with it, and a link-like navigation to the page."""

    head_url = ""

    def do_GET(self) -> None:
        token = urllib.parse.quote(READ_TOKEN)
        pages = {
            "/post": (
                f'<form method="post" action="{self.head_url}/login">'
                f'<input name="token" value="{READ_TOKEN}"></form><script>document.forms[0].submit()</script>'
            ),
            "/get": (
                f'<img src="{self.head_url}/login?token={token}"><img src="{self.head_url}/?token={token}">'
            ),
            "/go": f'<script>location.href = "{self.head_url}/"</script>',
        }
        body = f"<!DOCTYPE html><html><body>{pages.get(self.path, '')}</body></html>".encode()
        self.send_page(body)


def test_another_site_cannot_log_the_browser_in_nor_make_it_send_its_session(
    paged: Paged, tmp_path: Path
) -> None:
    """Its auto-posted form is refused, its images open nothing, and its navigation to the
    head's page carries no credential (401): only the head's own script, in the head's
    origin, sends the tab's session (what the tab then shows, the other site cannot read)."""
    head = paged.head
    Evil.head_url = head.url
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    evil = f"http://localhost:{server.server_address[1]}"
    thread = fake_server.serve_forever(server)
    browser = Browser(tmp_path)
    try:
        since = len(browser.events)
        browser.page("Page.navigate", url=evil + "/post")  # the form posts itself to the head
        assert browser.wait_response(head.url + "/login", since) == 403
        since = len(browser.events)
        browser.navigate(evil + "/get")
        assert (
            browser.wait_response(head.url + "/login?token=" + urllib.parse.quote(READ_TOKEN), since) == 405
        )
        assert browser.page("Network.getCookies", urls=[head.url])["cookies"] == []
        assert session_kept(browser) == ""
        log_in(browser, head, READ_TOKEN)
        assert session_kept(browser)
        since = len(browser.events)
        browser.page("Page.navigate", url=evil + "/go")  # to the head's page, cross-site:
        assert browser.wait_response(head.url + "/", since) == 401  # the navigation carries nothing
    finally:
        browser.close()
        fake_server.stop(server, thread)
    # The network-log check catches a page asking another origin: the evil pages asked the head.
    evil_asked = net_log_requests(browser.net_log, page_site="http://localhost")
    assert any(url.startswith(head.url) for url in evil_asked)


def test_chromium_is_debians() -> None:
    assert CHROMIUM == "/usr/bin/chromium"


class OtherPort(Page):
    """Another service on the head's host (Ray's dashboard, Grafana): it keeps the cookies the
    browser sends it and replays them, alone, to the head's page."""

    head_url = ""
    asked: ClassVar[list[tuple[str, int]]] = []
    """Per request, the cookies heard and the head's answer to their replay, kept together:
    the browser asks for ``/`` and the favicon at once, and a count of one taken while the
    other's replay was in flight read two heard, one replayed."""

    def do_GET(self) -> None:
        cookies = self.headers.get("Cookie") or ""
        status = http_get.get(self.head_url + "/", {"Cookie": cookies} if cookies else {})[0]
        self.asked.append((cookies, status))
        body = b"<!DOCTYPE html><html><body>another service on this host</body></html>"
        self.send_page(body)


@pytest.fixture(scope="module")
def bare_head(wire_token: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadDaemon]:
    """A head with a read token and no cluster (its GCS a closed port): the page's frame,
    login and session need no Ray."""
    root = tmp_path_factory.mktemp("bare-head")
    read = root / "read-token"
    read.write_text(READ_TOKEN + "\n")
    read.chmod(0o600)
    extra = ["--gcs", f"127.0.0.1:{refused_port()}", "--interval", "1", "--read-token-file", str(read)]
    head = HeadDaemon(base_env(RAY_AUTH_MODE="disabled"), root / "head.log", extra, wire_token)
    try:
        yield head
    finally:
        head.stop()


def test_a_login_replayed_alone_from_another_port_opens_nothing(
    bare_head: HeadDaemon, tmp_path: Path
) -> None:
    """A browser sends a host's cookies to every port of that host, so after a
    login Ray's dashboard or Grafana on the head's host received ``rayscope_page=...`` and
    could replay it for 12 h. Now the login leaves its session in the tab's
    ``sessionStorage`` (scoped to the head's origin, its port included) and the page's script
    sends it in a header: the other port hears no cookie of the head's, its replay is the
    login form (401), its own origin's storage is empty, and the head's tab still shows the
    page. Before: the other port heard the cookie and its replay got the page (200).
    Positive control: the session as a cookie again (the code before this rule)."""
    head = bare_head
    OtherPort.head_url, OtherPort.asked = head.url, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OtherPort)
    other = f"http://127.0.0.1:{server.server_address[1]}"
    thread = fake_server.serve_forever(server)
    browser = Browser(tmp_path)
    try:
        log_in(browser, head, READ_TOKEN)  # the page, opened by the login
        browser.navigate(other + "/")  # the same host, another port: what does it hear?
        assert browser.evaluate("document.body.innerText") == "another service on this host"
        assert browser.evaluate("sessionStorage.length + document.cookie.length") == 0
        asked = list(OtherPort.asked)
        heard, replays = [cookies for cookies, _ in asked], [status for _, status in asked]
        browser.navigate(head.url + "/")  # back on the head, in the same tab
        browser.wait_for(PAGE_SHOWN)
    finally:
        browser.close()
        fake_server.stop(server, thread)
    assert heard, "the other port was never asked"
    heads_cookies = [cookies for cookies in heard if "rayscope" in cookies]
    assert (replays, heads_cookies) == ([401] * len(heard), [])


def test_a_headless_browser_opens_the_page_with_a_bearer_header(
    bare_head: HeadDaemon, tmp_path: Path
) -> None:
    """docs/page.md's recipe for a script: DevTools' ``Network.setExtraHTTPHeaders`` (what
    Playwright's ``extra_http_headers`` sends) with the read token as a bearer token opens
    the page and its refreshes, no login; a wrong token gets the form."""
    browser = Browser(tmp_path)
    try:
        wrong = {"Authorization": "Bearer wrong-token-0123456789"}
        browser.page("Network.setExtraHTTPHeaders", headers=wrong)
        browser.navigate(bare_head.url + "/")
        assert browser.evaluate("document.querySelector('form.login') !== null")
        browser.page("Network.setExtraHTTPHeaders", headers={"Authorization": f"Bearer {READ_TOKEN}"})
        browser.navigate(bare_head.url + "/?marked=1")
        browser.wait_for(PAGE_SHOWN)
        browser.wait_for("document.getElementById('age').textContent.startsWith('updated')", timeout_s=20)
        refreshes = [status for url, status in browser.responses() if "fragment=1" in url]
    finally:
        browser.close()
    assert refreshes and set(refreshes) == {200}, refreshes
