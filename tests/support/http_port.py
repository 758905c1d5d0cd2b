"""The head's real HTTP port (``HttpPort``, its asyncio protocol) served from a thread on loopback."""

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from rayscope.head.serve.http import HttpPort


@contextlib.contextmanager
def serving(port: HttpPort) -> Iterator[int]:
    """``port`` listening on a free loopback port (the number yielded); closed afterwards."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(port.connection, "127.0.0.1", 0))
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
        port.close()
