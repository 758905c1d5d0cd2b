"""Debian's Chromium, headless, driven through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: JSON messages ended by NUL on file descriptors 3 and 4, no
port, no WebSocket library), with Chromium's own network log (``--log-net-log``) beside it.

Every wait has a deadline; :meth:`Browser.close` ends the browser by its pid (SIGTERM, then
SIGKILL). Chromium as root needs ``--no-sandbox``.
"""

import base64
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Optional

from tests import debian_deps

CHROMIUM = shutil.which("chromium")

# No traffic of Chromium's own (updates, safe browsing, sync, metrics): what the network log
# then holds is what the page asked for.
QUIET = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--metrics-recording-only",
    "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication",
    "--hide-scrollbars",
)


NAVIGATED = ("Inspected target navigated or closed", "Execution context was destroyed")
"""DevTools' errors for an evaluation whose page went away under it."""


class Browser:
    """One Chromium with one page (a tab), its profile in ``root``."""

    def __init__(self, root: Path, width: int = 1100, height: int = 700, timeout_s: float = 30.0) -> None:
        chromium = debian_deps.need("chromium")
        self.timeout_s = timeout_s
        self.net_log = root / "netlog.json"
        self.log_path = root / "chromium.log"
        commands_read, self._commands = os.pipe()
        self._answers, answers_write = os.pipe()
        args = [
            *QUIET,
            f"--user-data-dir={root / 'profile'}",
            f"--log-net-log={self.net_log}",
            "--net-log-capture-mode=Default",
            f"--window-size={width},{height}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{commands_read} 4>&{answers_write}', chromium, *args],
            pass_fds=(commands_read, answers_write),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )
        os.close(commands_read)
        os.close(answers_write)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable", session=self.session)

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._answers, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            while b"\0" in buffer:
                message, buffer = buffer.split(b"\0", 1)
                self._inbox.put(json.loads(message))

    def _pump(self, until: float) -> None:
        """Take what Chromium sent until ``until`` (monotonic), or one message."""
        try:
            message = self._inbox.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return
        if "id" in message:
            self._replies[message["id"]] = message
        else:
            self.events.append(message)

    def call(self, method: str, session: Optional[str] = None, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result, or an AssertionError with Chromium's error."""
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while ident not in self._replies:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"chromium: no answer to {method}:\n{self.log_text()[-2000:]}")
            self._pump(deadline)
        reply = self._replies.pop(ident)
        assert "error" not in reply, (method, reply["error"])
        result: dict[str, Any] = reply.get("result", {})
        return result

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, session=self.session, **params)

    def wait_event(self, method: str, since: int = 0, timeout_s: Optional[float] = None) -> dict[str, Any]:
        """The first event ``method`` at or after index ``since`` of :attr:`events`."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            for event in self.events[since:]:
                if event.get("method") == method:
                    return event
            if time.monotonic() > deadline:
                raise AssertionError(f"chromium: no {method} within the deadline")
            self._pump(deadline)

    def wait_response(self, url: str, since: int = 0) -> int:
        """The status of the first response for ``url`` after index ``since`` of :attr:`events`."""
        while True:
            event = self.wait_event("Network.responseReceived", since)
            if event["params"]["response"]["url"] == url:
                return int(event["params"]["response"]["status"])
            since = self.events.index(event) + 1

    def navigate(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        since = len(self.events)
        self.page("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", since)

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value in the page (awaited if a promise)."""
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: Optional[float] = None) -> Any:
        """Poll a JavaScript expression until it is truthy; its value. A page that navigates
        meanwhile (a form sent, ``location.replace``) is asked again in the next one."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except AssertionError as err:
                if not any(gone in str(err) for gone in NAVIGATED):
                    raise
                value = None
            if value:
                return value
            self._pump(time.monotonic() + 0.2)
        raise AssertionError(f"chromium: {expression} never became true")

    def dom(self) -> str:
        """What ``chromium --dump-dom`` prints: the document's HTML as scripts left it."""
        return str(self.evaluate("document.documentElement.outerHTML"))

    def screenshot(self, path: Path) -> None:
        data = self.page("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        path.write_bytes(base64.b64decode(data))

    def at_width(self, width: int, height: int = 900) -> None:
        """Lay the page out as a window ``width`` CSS pixels wide (DevTools' device metrics)."""
        self.page(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def screenshot_whole(self, path: Path, width: int, most: int = 2400) -> None:
        """The page at ``width`` from its top to its end (``most`` pixels at most), as one PNG."""
        self.at_width(width)
        height = min(most, int(self.evaluate("document.documentElement.scrollHeight")))
        self.at_width(width, height)
        self.screenshot(path)

    def requested_urls(self) -> list[str]:
        """Every URL the page asked for (DevTools' ``Network.requestWillBeSent``)."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def responses(self) -> list[tuple[str, int]]:
        return [
            (e["params"]["response"]["url"], int(e["params"]["response"]["status"]))
            for e in self.events
            if e.get("method") == "Network.responseReceived"
        ]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def close(self) -> None:
        """Close the browser (Browser.close), then SIGTERM/SIGKILL its process group by pid;
        the network log is complete once it has exited."""
        if self.process.poll() is None:
            try:
                os.write(self._commands, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
                self.process.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(self.process.pid, sig)
                        self.process.wait(timeout=10)
                        break
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        continue
        for fd in (self._commands, self._answers):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()


def net_log_requests(path: Path, page_site: str) -> list[str]:
    """The URLs of every request Chromium's network log says a page of ``page_site`` (the
    top frame's site, e.g. ``http://127.0.0.1``) made: its network isolation key names that
    site. Chromium's own traffic (updates, sign-in) has another key and is left out."""
    text = path.read_text()
    if not text.rstrip().endswith("}"):  # a log cut short by a kill: close its event list
        text = text.rstrip().rstrip(",") + "]}"
    log = json.loads(text)
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log.get("events", []):
        params = event.get("params") or {}
        key = str(params.get("network_isolation_key", "")).split(" ")
        if event.get("type") == start_job and key[0] == page_site and "url" in params:
            urls.append(str(params["url"]))
    return urls
