"""``rayscope head``: the report port, the HTTP port and the poller, run until a signal."""

import asyncio
import errno
import hmac
import logging
import os
import resource
import signal
import threading
import time
import weakref
from typing import Callable, NoReturn, Optional

from rayscope.defaults import DEFAULT_TIMEOUT_S
from rayscope.errors import EXIT_FAILED, EXIT_INTERNAL, EXIT_USAGE, AgentError
from rayscope.head.access import admission
from rayscope.head.access.origin import Hosts
from rayscope.head.poll.dashboard import DashboardSetting, DashboardWorker
from rayscope.head.poll.poller import PollerGuard
from rayscope.head.serve import ingest
from rayscope.head.serve.callbacks import ProtocolErrors, loop_exception_handler
from rayscope.head.serve.http import HTTP_WORKERS, REQUEST_DEADLINE_S, HttpPort
from rayscope.head.serve.routes import Routes
from rayscope.head.store.state import HeadState
from rayscope.head.store.usage_store import DEFAULT_WINDOW_S, UsageStore, open_store
from rayscope.net import tokens
from rayscope.net.addresses import is_loopback, split_address
from rayscope.net.tls import NO_TLS, TlsFiles, server_context
from rayscope.node.placed_agents import RayAgents
from rayscope.sinks.logs import THROTTLE_S, LogThrottle, filtered_stderr
from rayscope.sources.gcs import reader as gcs

log = logging.getLogger("rayscope.head")


def raise_fd_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as err:
            log.warning("cannot raise the file limit from %d to %d: %s", soft, target, err)
    return int(soft)


def remove_agents(agents: RayAgents, strict: bool = False) -> int:
    """Remove every agent placed through Ray and disconnect; how many were removed.

    The head's shutdown (``strict=False``) logs a failure and stops anyway: the GCS may be
    gone. ``head --remove`` (``strict=True``) is asked for nothing else, so a failure is its
    answer: :class:`AgentError` (exit 1)."""
    try:
        removed = agents.remove_all()
        agents.close()
    except Exception as err:  # Ray's own errors, whatever their class
        if strict:
            raise AgentError(f"cannot remove the agents placed through Ray: {err}", EXIT_FAILED) from None
        log.warning("could not remove the agents placed through Ray: %s", err)
        return 0
    return removed


def _bound(server: asyncio.AbstractServer, address: tuple[str, int]) -> tuple[str, int]:
    """``address`` with the port the OS gave where it was 0 (``--listen 127.0.0.1:0``)."""
    sockets = getattr(server, "sockets", ()) or ()  # asyncio.Server's; AbstractServer has none
    if address[1] != 0 or not sockets:
        return address
    return address[0], int(sockets[0].getsockname()[1])


def cannot_listen(err: OSError, address: tuple[str, int], option: str) -> AgentError:
    """The head could not take ``address`` (its ``option``: ``--listen`` or ``--http``), in
    one line: a port in use names who may hold it and how to find them (exit 1)."""
    host, port = address
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if err.errno == errno.EADDRINUSE:
        return AgentError(
            f"{option} {where} is in use: a rayscope head (or another program) already listens there"
            f" (`ss -ltnp 'sport = :{port}'` names it): stop it, or give {option} another port",
            EXIT_FAILED,
        )
    reason = os.strerror(err.errno) if err.errno else str(err)
    return AgentError(f"head agent cannot listen on {where} ({option}): {reason.lower()}", EXIT_FAILED)


class Head:
    """The head agent's servers: :meth:`serve` runs them until :meth:`stop` or a signal."""

    def __init__(
        self,
        listen: tuple[str, int],
        http: tuple[str, int],
        gcs_address: Optional[str],
        interval_s: float,
        token: bytes,
        gcs_timeout_s: float = DEFAULT_TIMEOUT_S,
        read_token: bytes = b"",
        tls: TlsFiles = NO_TLS,
        max_pending_per_address: int = admission.MAX_UNAUTH_PER_HOST,
        agents: Optional[RayAgents] = None,
        usage: Optional[UsageStore] = None,
        http_hosts: tuple[str, ...] = (),
        dashboard: Optional[DashboardSetting] = None,
    ) -> None:
        for host, _ in (listen, http):
            if not token and not is_loopback(host):
                raise ValueError(
                    f"refusing to listen on {host} without a token: anyone who reaches it could"
                    " send reports or read the cluster; pass --token-file (the same file on every agent)"
                )
        if read_token and (not token or hmac.compare_digest(read_token, token)):
            raise ValueError("the read-only token must differ from the agents' token (--token-file)")
        self.listen, self.http, self.token, self.read_token = listen, http, token, read_token
        self.hosts = Hosts(http_hosts, http[0])
        if max_pending_per_address < 1:
            raise ValueError(f"--max-pending must be at least 1, not {max_pending_per_address}")
        self.ssl_context = server_context(tls)
        self.max_pending_per_address = max_pending_per_address
        self.state = HeadState(interval_s, gcs_address, usage)
        self._reader = gcs.GcsReader(gcs_address, gcs_timeout_s) if gcs_address else None
        self._stop = threading.Event()
        self.http_port: Optional[HttpPort] = None
        self.throttle = LogThrottle(log)
        self.protocol_errors = ProtocolErrors()
        """Callbacks of either port that raised (each closed its connection), for ``/healthz``."""
        self.state.more_health.append(self.protocol_errors.as_dict)
        self.fatal = ""
        """Why the head stopped because it cannot go on (a ``MemoryError`` outside any
        connection); ``""``: it did not."""
        self.agents = agents
        self.dashboard = dashboard if dashboard is not None else DashboardSetting(None, {})
        if agents is not None:
            self.state.more_health.append(agents.health)
            self.state.more_sources.append(agents.status)

    async def _start_http(self) -> asyncio.AbstractServer:
        """The HTTP port in this event loop: requests read here, answered by its workers."""
        read_tokens = tuple(t for t in (self.token, self.read_token) if t)
        tls = self.ssl_context is not None
        routes = Routes(self.state, read_tokens, self.throttle, tls=tls, hosts=self.hosts)
        port = HttpPort(routes, self.throttle, self.protocol_errors)
        self.http_port = port
        self.state.more_health.append(port.counters.as_dict)
        self.state.more_health.append(routes.counters)
        return await asyncio.get_running_loop().create_server(
            port.connection,
            *self.http,
            ssl=self.ssl_context,
            backlog=ingest.ACCEPT_BACKLOG,
            ssl_handshake_timeout=REQUEST_DEADLINE_S if self.ssl_context else None,
        )

    async def serve(self) -> None:
        """Run until :meth:`stop` (or SIGTERM/SIGINT): ingest, poll, answer queries."""
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(loop_exception_handler(self.throttle, self.cannot_go_on))
        nofile = raise_fd_limit()
        max_total = max(16, min(admission.MAX_CONNECTIONS, nofile - ingest.FD_RESERVE - HTTP_WORKERS))
        agents: weakref.WeakSet[ingest.ReportProtocol] = weakref.WeakSet()
        try:
            server = await self._start_reports(max_total, agents)
        except OSError as err:
            raise cannot_listen(err, self.listen, "--listen") from None
        self.listen = _bound(server, self.listen)
        if self.agents is not None:
            self.agents.head = self.listen  # the agents it places report to the port bound (0: the OS's)
        try:
            http_server = await self._start_http()
        except OSError as err:
            server.close()
            raise cannot_listen(err, self.http, "--http") from None
        except BaseException:
            server.close()
            raise
        self.http = _bound(http_server, self.http)
        try:
            await self._run(loop, server, http_server, max_total, agents)
        finally:  # stopped, both ports closed, whatever ends the run (an error left them listening)
            self._stop.set()
            server.close()
            http_server.close()
        await self._shut_down()

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        server: asyncio.AbstractServer,
        http_server: asyncio.AbstractServer,
        max_total: int,
        agents: "weakref.WeakSet[ingest.ReportProtocol]",
    ) -> None:
        """Poll, flush and serve until :meth:`stop`, then hang up on every agent."""
        # The dashboard beside the poller, not in its round: a silent one never ages the view.
        dashboard = DashboardWorker(self.state, self.dashboard, self._stop)
        dashboard.start()
        poller = PollerGuard(self.state, self._reader, self._stop, self.agents, dashboard=dashboard)
        poller.start()
        _every(loop, self.state.interval_s, lambda: (poller.check(), dashboard.check()), self._stop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        log.info(
            "head agent: reports on %s:%d, HTTP on %s:%d, GCS %s, interval %g s%s%s; up to %d agents",
            *self.listen,
            *self.http,
            self.state.gcs_address or "(none)",
            self.state.interval_s,
            ", token required" if self.token else "",
            ", TLS" if self.ssl_context else "",
            max_total,
        )
        _every(loop, THROTTLE_S, self.throttle.flush)
        async with server:
            await loop.run_in_executor(None, self._stop.wait)
            # From Python 3.12.1 the server's exit waits for every connection to close, and
            # node agents never hang up by themselves: close theirs first.
            server.close()
            http_server.close()
            for agent in list(agents):
                agent.close()

    async def _start_reports(
        self, max_total: int, agents: "weakref.WeakSet[ingest.ReportProtocol]"
    ) -> asyncio.AbstractServer:
        """The report port in this event loop, at most ``max_total`` connections; each agent
        connected is kept in ``agents`` (weakly), to be hung up on at shutdown."""
        guard = admission.ConnectionGuard(
            max_total, self.max_pending_per_address, self.throttle, self.state.count_rejected
        )
        self.state.net = guard.counters
        idle = max(60.0, 10 * self.state.interval_s)

        def accept() -> ingest.ReportProtocol:
            agent = ingest.ReportProtocol(self.state, self.token, idle, guard, self.protocol_errors)
            agents.add(agent)
            return agent

        server = await asyncio.get_running_loop().create_server(
            accept,
            *self.listen,
            ssl=self.ssl_context,
            backlog=ingest.ACCEPT_BACKLOG,
            ssl_handshake_timeout=ingest.FRAME_DEADLINE_S if self.ssl_context else None,
        )
        try:
            for listening in server.sockets:
                ingest.widen_listen_queue(listening.fileno())
        except BaseException:
            server.close()
            raise
        return server

    async def _shut_down(self) -> None:
        """After the servers closed: the agents placed through Ray removed, the HTTP workers
        stopped, the usage history saved."""
        if self.agents is not None:
            await asyncio.get_running_loop().run_in_executor(None, remove_agents, self.agents)
        if self.http_port is not None:
            self.http_port.close()
        try:
            self.state.usage.save(time.monotonic())
        except AgentError as err:
            log.warning("usage history not saved: %s", err)
        log.info("head agent stopped")

    def stop(self) -> None:
        self._stop.set()

    def cannot_go_on(self, why: str) -> None:
        """Stop the head for good (:func:`run` exits 70 with ``why``): the first reason kept."""
        self.fatal = self.fatal or why
        self._stop.set()


def _every(
    loop: asyncio.AbstractEventLoop,
    interval_s: float,
    call: Callable[[], object],
    until: Optional[threading.Event] = None,
) -> None:
    """``call`` every ``interval_s`` on ``loop``, the first time after one interval; no more
    once ``until`` is set."""

    def tick() -> None:
        call()
        if until is None or not until.is_set():
            loop.call_later(interval_s, tick)

    loop.call_later(interval_s, tick)


def run(
    *,
    listen: str,
    http: str,
    gcs_address: Optional[str],
    interval_s: float,
    token_file: Optional[str],
    timeout_s: float,
    read_token_file: Optional[str],
    tls: TlsFiles,
    max_pending: int,
    agents: str,
    remove: bool,
    usage_window_s: float = DEFAULT_WINDOW_S,
    usage_state: Optional[str] = None,
    http_hosts: tuple[str, ...] = (),
    dashboard: Optional[str] = None,
) -> Optional[str]:
    """``rayscope head``: serve until a signal, or with ``remove`` remove the agents placed
    through Ray and return what to print. :class:`AgentError` for what an operator fixes
    (exit 2: a bad option or file; exit 1: a port that cannot be had)."""
    from rayscope.node import collect  # the local raylet's address; psutil, off the CLI's fast path

    token, read_token = tokens.read_token(token_file), tokens.read_token(read_token_file)
    try:
        setting = DashboardSetting(dashboard)
    except ValueError as err:
        raise AgentError(str(err), EXIT_USAGE) from None
    address = collect.resolve_gcs_here(gcs_address)
    keeper = RayAgents(address, split_address(listen), token, interval_s) if agents == "ray" else None
    if remove:
        if keeper is None:
            raise AgentError("--remove goes with --agents ray", EXIT_USAGE)
        return f"removed {remove_agents(keeper, strict=True)} agent(s) placed through Ray"
    usage = open_store(usage_window_s, interval_s, usage_state, time.monotonic(), time.time())
    try:
        with filtered_stderr():  # Ray's C++ client writes the GCS's error text to fd 2 (rule 11)
            server = Head(
                split_address(listen),
                split_address(http),
                address,
                interval_s,
                token,
                timeout_s,
                read_token,
                tls,
                max_pending,
                agents=keeper,
                usage=usage,
                http_hosts=http_hosts,
                dashboard=setting,
            )
            asyncio.run(server.serve())
    except MemoryError:  # outside the event loop's reach, or again while it stopped
        out_of_memory()
    except ValueError as err:
        raise AgentError(str(err), EXIT_USAGE) from None
    except OSError as err:
        raise AgentError(f"head agent cannot start: {err.strerror or err}", EXIT_FAILED) from None
    if server.fatal:
        raise AgentError(f"the head cannot go on: {server.fatal}; stopped", EXIT_INTERNAL)
    return None


OUT_OF_MEMORY = b"rayscope: the head cannot go on: MemoryError (out of memory); stopped\n"
"""The one line of a head that ran out of memory where nothing could catch it."""


def out_of_memory() -> NoReturn:
    """Exit 70 with :data:`OUT_OF_MEMORY` on stderr, at once: nothing here allocates (the
    line is written as it is), and the interpreter's shutdown is skipped (it joins the HTTP
    workers, and may need memory the head does not have)."""
    try:
        os.write(2, OUT_OF_MEMORY)
    finally:
        os._exit(EXIT_INTERNAL)
