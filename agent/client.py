"""The head agent's HTTP client: ``status --head`` reads the merged rollup from it.

The fast path of the CLI: no ray, no psutil, no pynvml — only the standard library's HTTP
client and msgspec, so a status query costs little more than the interpreter's start.
"""

import urllib.error
import urllib.request
from urllib.parse import urlsplit

import msgspec

from agent.errors import AgentError
from agent.model import ClusterStatus

HEAD_ENV = "RAYSCOPE_HEAD"
DEFAULT_HEAD_PORT = 7532
EXIT_NO_DATA = 2


def parse_head_url(text: str) -> str:
    """``HOST[:PORT]`` or ``http://HOST[:PORT]`` → the head agent's base URL; ``ValueError``."""
    url = urlsplit(text.strip() if "://" in text else f"http://{text.strip()}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{text!r} is not a head agent URL (http://HOST:PORT)")
    try:
        port = url.port or DEFAULT_HEAD_PORT
    except ValueError:
        raise ValueError(f"{text!r}: port must be a number from 1 to 65535") from None
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{port}"


def head_status(url: str, token: bytes, timeout_s: float, gpus: bool = False) -> ClusterStatus:
    """The rollup a head agent serves (``GET /v1/status?all=1``); :class:`AgentError` (exit 2)
    when it cannot be had. No ray import on this path: it is the fast one."""
    request = urllib.request.Request(f"{url}/v1/status?all=1" + ("&gpus=1" if gpus else ""))
    if token:
        request.add_header("Authorization", "Bearer " + token.decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as err:
        if err.code == 401:
            raise AgentError(
                f"head agent at {url} requires its token: pass --token-file", EXIT_NO_DATA
            ) from None
        raise AgentError(f"head agent at {url} answered HTTP {err.code}", EXIT_NO_DATA) from None
    except urllib.error.URLError as err:
        reason = getattr(err.reason, "strerror", None) or str(err.reason)
        raise AgentError(f"head agent unreachable at {url} ({reason.lower()})", EXIT_NO_DATA) from None
    except (TimeoutError, OSError):
        raise AgentError(f"head agent unreachable at {url} (timeout {timeout_s:g} s)", EXIT_NO_DATA) from None
    try:
        return msgspec.json.decode(body, type=ClusterStatus)
    except msgspec.DecodeError as err:
        raise AgentError(f"unexpected answer from head agent at {url}: {err}", EXIT_NO_DATA) from None
