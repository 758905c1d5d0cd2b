"""Hosts for the live tests made of Linux namespaces: each "node" has its own network (a
network namespace on a private bridge), its own processes (a pid namespace: its raylet is the
only one its agents see), its own host name, and its own ``/etc`` (an overlay on the host's:
``/etc/rayscope`` written on one node is not on another). Everything else (``/tmp``, the
repository, ``.venv``) is the host's.

Needs root, ``ip`` (iproute2), util-linux's ``unshare`` and ``nsenter``, and overlayfs:
:func:`missing` says what is not there. A node's processes all die with it: its first process
is the pid namespace's init, and :meth:`Lan.close` SIGKILLs it (the kernel then kills every
process of the namespace), then removes the namespaces and links by name.
"""

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from tests import debian_deps

SUBNET = "10.213.{}.{}"
PREFIX = 24


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def missing() -> str:
    """Why namespaced nodes cannot be made here (``""`` when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "unshare", "nsenter"):
        why = debian_deps.why_missing(tool)
        if why:
            return why
    probe = subprocess.run(
        ["unshare", "--mount", "--pid", "--uts", "--fork", "--mount-proc", "true"],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return "" if probe.returncode == 0 else "this kernel or sandbox allows no mount and pid namespaces"


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class Node:
    """One namespaced host on the bridge: :meth:`run` and :meth:`start` run commands in it."""

    def __init__(self, lan: "Lan", name: str, ip: str) -> None:
        self.name, self.ip, self.lan = name, ip, lan
        self.netns = f"{lan.tag}-{name}"
        self.root = lan.root / name
        self.upper = self.root / "etc-upper"
        for d in (self.upper, self.root / "etc-work"):
            d.mkdir(parents=True)
        _ip("netns", "add", self.netns)
        outside = f"{lan.tag}{len(lan.nodes)}"
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _ip("link", "set", outside, "netns", lan.netns)
        _ip("-n", lan.netns, "link", "set", outside, "master", "br0", "up")
        _ip("-n", self.netns, "addr", "add", f"{ip}/{PREFIX}", "dev", "eth0")
        _ip("-n", self.netns, "link", "set", "eth0", "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")
        init = (
            "mount -t overlay overlay"
            f" -o lowerdir=/etc,upperdir={self.upper},workdir={self.root / 'etc-work'} /etc"
            f" && hostname {name} && echo ready && exec sleep infinity"
        )
        self._unshare = subprocess.Popen(
            [
                *("ip", "netns", "exec", self.netns),
                *(
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "--uts",
                    "--pid",
                    "--fork",
                    "--mount-proc",
                ),
                *("sh", "-c", init),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self._unshare.stdout is not None
        said = self._unshare.stdout.readline()
        if said.strip() != "ready":
            raise RuntimeError(f"node {name} did not start: {said}{self._unshare.stdout.read()}")
        kids = _children(self._unshare.pid)
        assert len(kids) == 1, kids
        self.init_pid = kids[0]
        """The pid namespace's init, as this (the host's) pid namespace numbers it."""

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-n", "-p", "--wd=/", "--", *argv]

    def run(
        self, shell: str, env: Mapping[str, str], timeout: float = 120.0
    ) -> "subprocess.CompletedProcess[str]":
        """``sh -c shell`` on this node, to the end."""
        return subprocess.run(
            self.command(["sh", "-c", shell]),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, shell: str, env: Mapping[str, str], log: Path) -> "Process":
        """``sh -c 'exec shell'`` left running on this node, its output in ``log``."""
        return Process(self, shell, env, log)

    def etc(self, path: str) -> Path:
        """Where this node's ``/etc/...`` file lives on the host (the overlay's upper layer)."""
        assert path.startswith("/etc/")
        return self.upper / path[len("/etc/") :]


class Process:
    """A command running on a node; :meth:`signal` reaches the command itself (not nsenter)."""

    def __init__(self, node: Node, shell: str, env: Mapping[str, str], log: Path) -> None:
        self.shell, self.log = shell, log
        self._out = open(log, "a")  # noqa: SIM115 - closed in wait()
        self.nsenter = subprocess.Popen(
            node.command(["sh", "-c", f"exec {shell}"]), env=dict(env), stdout=self._out, stderr=self._out
        )
        deadline = time.monotonic() + 10
        while not _children(self.nsenter.pid):
            assert time.monotonic() < deadline, f"{shell}: never started"
            time.sleep(0.02)
        self.pid = _children(self.nsenter.pid)[0]

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def wait(self, timeout: float = 20.0) -> Optional[int]:
        """The command's exit code (``None`` if it had to be killed)."""
        try:
            code: Optional[int] = self.nsenter.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.nsenter.wait(timeout=10)
            code = None
        self._out.close()
        return code

    def text(self) -> str:
        return self.log.read_text()


class Lan:
    """A bridge in a namespace of its own, and the nodes on it (``10.213.N.1``, ``.2`` ...)."""

    def __init__(self, root: Path) -> None:
        self.tag = "rs" + uuid.uuid4().hex[:5]  # link names are at most 15 characters
        self.root = root
        self.netns = f"{self.tag}-lan"
        self.subnet = int(self.tag[2:4], 16) % 200 + 20
        self.nodes: list[Node] = []
        _ip("netns", "add", self.netns)
        _ip("-n", self.netns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.netns, "link", "set", "br0", "up")

    def node(self, name: str) -> Node:
        node = Node(self, name, SUBNET.format(self.subnet, len(self.nodes) + 1))
        self.nodes.append(node)
        return node

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.init_pid, signal.SIGKILL)  # the kernel kills the rest of its namespace
            with contextlib.suppress(subprocess.TimeoutExpired):
                node._unshare.wait(timeout=20)
            if node._unshare.stdout is not None:
                node._unshare.stdout.close()
        for name in [n.netns for n in self.nodes] + [self.netns]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10, check=False)


def lan(root: Path) -> "contextlib.closing[Lan]":
    """A :class:`Lan` for the block, every node and namespace gone after it."""
    return contextlib.closing(Lan(root))
