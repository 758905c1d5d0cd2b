"""The head's real HTTP port (``HttpPort``, its asyncio protocol) served from a thread on loopback,
and any asyncio protocol served the same way."""

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Iterator
from typing import Callable, Optional

from rayscope.head.serve.http import HttpPort


@contextlib.contextmanager
def asyncio_serving(
    protocol: Callable[[], asyncio.BaseProtocol], context: Optional[ssl.SSLContext] = None
) -> Iterator[int]:
    """``protocol`` served by an event loop on a thread of its own, on a free loopback port (the
    number yielded; over TLS with the server ``context`` given); the loop closed afterwards."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(protocol, "127.0.0.1", 0, ssl=context))
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.run_until_complete(server.wait_closed())
        loop.close()


@contextlib.contextmanager
def serving(port: HttpPort) -> Iterator[int]:
    """``port`` listening on a free loopback port (the number yielded); closed afterwards."""
    try:
        with asyncio_serving(port.connection) as number:
            yield number
    finally:
        port.close()
