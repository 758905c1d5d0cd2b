"""The embedded ``status``'s GCS child, made cheaper without changing what runs,
where it connects or what it reads:

* started before the CLI's imports (``sources/gcs_prestart``), isolated as every GCS child
  (``-I``, ``/``, Ray's variables only), told the address on stdin only by the read, after
  the rules that chose it; a child no read takes is killed;
* ``ray._raylet`` without the ``__init__`` of ``ray`` and ``ray.util``
  (``raycompat.import_raylet``), and a Ray that needs them read again with ``import ray``;
* one autoscaler-state read for nodes and pending demand, the live actor table only when
  something waits (``gcs_read.read_pending``).
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rayscope.sources import trust
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import prestart as gcs_prestart
from rayscope.sources.gcs import read as gcs_read

pytestmark = pytest.mark.usefixtures("no_child_left")


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_the_early_child_runs_isolated_and_hears_the_address_only_from_the_read(
    tmp_path: Path, fake_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started from a directory another user could write and with a planted environment:
    the child runs in ``/`` with ``-I`` and Ray's variables only, and its words come on
    stdin from the read. Positive control: drop ``cwd="/"`` or ``env=`` in
    ``gcs_prestart.start``."""
    record = tmp_path / "record"
    python = _script(
        tmp_path / "python",
        f'{{ pwd; echo "ARGS $1 $2 $4"; env; }} > {record}\nread words\necho "WORDS $words" >> {record}\n'
        'echo \'{"ok": false, "error": "x"}\'\n',
    )
    monkeypatch.setenv("RAYSCOPE_CANARY", "planted")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/etc/ray-token")
    monkeypatch.chdir(tmp_path)
    gcs_prestart.start(python)
    _, _, statuses = gcs_child.read_cluster(fake_gcs, 5.0, python)
    lines = record.read_text().splitlines()
    assert lines[0] == "/"
    assert lines[1] == "ARGS -I -c -"
    env = dict(line.split("=", 1) for line in lines[2:-1] if "=" in line)
    assert "RAYSCOPE_CANARY" not in env and "PYTHONPATH" not in env
    assert env["RAY_AUTH_TOKEN_PATH"] == "/etc/ray-token"
    words = json.loads(lines[-1].removeprefix("WORDS "))
    assert words[0] == fake_gcs and 0 < float(words[1]) <= 5.0 and words[2:] == []
    assert statuses[0].reason == f"GCS at {fake_gcs} failed: x"
    assert not gcs_prestart._started  # taken by the read


def test_a_child_the_read_does_not_take_is_killed(tmp_path: Path) -> None:
    """Another interpreter chosen for the read (the raylet's Python), or no read at all: the
    early child does not outlive the command."""
    sleeper = _script(tmp_path / "python", "exec sleep 60\n")
    gcs_prestart.start(sleeper)
    child = gcs_prestart._started[0]
    assert gcs_prestart.take("/usr/bin/python3", gcs_prestart.script_for("/usr/bin/python3")) is None
    assert child.poll() is not None
    gcs_prestart.start(sleeper)
    child = gcs_prestart._started[0]
    gcs_prestart.discard()  # at exit
    assert child.poll() is not None and not gcs_prestart._started


def test_the_early_child_keeps_the_reads_deadline(tmp_path: Path, fake_gcs: str) -> None:
    """A child that never answers is killed at the read's deadline, and the message says
    whether it had imported ray, as for any GCS child."""
    silent = _script(tmp_path / "python", f"echo '{gcs_read.IMPORTED}' >&2\nexec sleep 60\n")
    gcs_prestart.start(silent)
    _, _, statuses = gcs_child.read_cluster(fake_gcs, 0.5, silent)
    assert statuses[0].reason == f"GCS unreachable at {fake_gcs} (timeout 0.5 s)"


def test_the_light_import_loads_the_client_without_the_worker() -> None:
    """Under this Ray: ``GcsClient`` is there, the worker, the actors and ``requests`` are
    not (what ``ray/__init__`` and ``ray.util``'s ``__init__`` would have imported)."""
    pytest.importorskip("ray")
    check = (
        "\nimport sys\nraylet = import_raylet({light})\nprint(__import__('json').dumps(["
        "hasattr(raylet, 'GcsClient'), 'ray._private.worker' in sys.modules, 'requests' in sys.modules]))\n"
    )
    source = trust.with_import_path(
        gcs_prestart.child_script().split("\nif __name__")[0], trust.parent_import_path("ray")
    )
    answers = {}
    for light in (True, False):
        done = subprocess.run(
            [sys.executable, "-I", "-c", source + check.format(light=light)],
            capture_output=True, text=True, timeout=120, check=True, cwd="/",
        )  # fmt: skip
        answers[light] = json.loads(done.stdout.splitlines()[-1])
    assert answers[True] == [True, False, False]
    assert answers[False] == [True, True, True]  # the control: a whole import has them


FAKE_RAY = {
    "__init__.py": "from ray import _version\n__version__ = _version.version\nset_up = True\n"
    "import ray._raylet\n",
    "_version.py": "version = '9.9.9'\ncommit = 'abc'\n",
    "util/__init__.py": "",
    "_raylet.py": (
        "import ray\n"
        "if not getattr(ray, 'set_up', False):\n"
        "    raise AttributeError(\"module 'ray' has no attribute 'set_up'\")\n"
        "class GcsClient:\n"
        "    def __init__(self, address):\n"
        "        raise RuntimeError('fake client: refused')\n"
    ),
}


def test_a_ray_that_needs_its_init_is_read_again_whole(tmp_path: Path, fake_gcs: str) -> None:
    """A Ray whose ``_raylet`` needs what ``ray/__init__`` sets up: the light import fails
    in the child, the child says so (``retry_whole``), and the read runs again with
    ``import ray`` whole, under the same deadline: the operator sees the GCS's answer (here
    the fake client's refusal), not the light import's. Positive control: ignore
    ``retry_whole`` in ``gcs_child._run_child`` (the reason becomes the AttributeError)."""
    for name, text in FAKE_RAY.items():
        (tmp_path / "ray" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ray" / name).write_text(text)
    runs = tmp_path / "runs"
    loader = (
        f"import sys; sys.path.insert(0, '{tmp_path}'); exec(compile(sys.argv.pop(1), 'rayscope', 'exec'))"
    )
    python = _script(  # the Ray node's Python, with that Ray and nothing else on its path
        tmp_path / "python",
        f'source="$3"\nshift 3\necho "$*" >> {runs}\n'
        f'exec {sys.executable} -I -S -c "{loader}" "$source" "$@"\n',
    )
    _, _, statuses = gcs_child.read_cluster(fake_gcs, 20.0, python)
    assert statuses[0].reason == f"GCS at {fake_gcs} failed: RuntimeError: fake client: refused"
    tried = runs.read_text().splitlines()
    assert len(tried) == 2 and not tried[0].endswith("whole") and tried[1].endswith("whole")


class FakeClient:
    """The GCS client calls ``read_pending`` makes, counted; its answers are Ray's own
    protobuf messages."""

    def __init__(self, waiting: bool) -> None:
        pb: Any = pytest.importorskip("ray.core.generated.autoscaler_pb2")
        reply = pb.GetClusterResourceStateReply()
        node = reply.cluster_resource_state.node_states.add()
        node.node_id = bytes.fromhex("ab" * 28)
        node.total_resources["GPU"] = 2.0
        node.available_resources["GPU"] = 0.8
        if waiting:
            request = reply.cluster_resource_state.pending_resource_requests.add()
            request.request.resources_bundle["GPU"] = 0.6
            request.count = 1
        self.reply = reply.SerializeToString()
        self.state_reads = 0
        self.actor_states: list[str] = []

    def get_cluster_resource_state(self, timeout_s: float) -> bytes:
        self.state_reads += 1
        return bytes(self.reply)

    async def async_get_all_actor_info(self, actor_state_name: str, timeout: float) -> dict[str, Any]:
        self.actor_states.append(actor_state_name)
        return {}


@pytest.mark.parametrize("waiting", [False, True], ids=["nothing waits", "a request waits"])
def test_the_live_actor_table_is_read_only_when_something_waits(waiting: bool) -> None:
    """Its per-device use judges a waiting shape and nothing else: with nothing waiting the
    read is two actor-table calls (the not-yet-placed states, at once), not three."""
    client = FakeClient(waiting)
    answer = gcs_read.read_pending(client, "x:1", 5.0)
    assert sorted(client.actor_states) == sorted(
        [*gcs_read.PENDING_ACTOR_STATES, *(["ALIVE"] if waiting else [])]
    )
    assert client.state_reads == 1 and answer["requests"] == (
        [{"shape": {"GPU": 0.6}, "count": 1, "label_selectors": []}] if waiting else []
    )
    assert answer["device_use"] == {}


def test_one_autoscaler_state_and_one_live_table_serve_nodes_pending_and_actors() -> None:
    """What the child reads once is handed on, not read again."""
    client = FakeClient(waiting=True)
    state = gcs_read.resource_state(client, 5.0)
    gcs_read.read_pending(client, "x:1", 5.0, state, alive=[])
    assert client.state_reads == 1 and "ALIVE" not in client.actor_states


def test_ctrl_c_during_the_read_kills_the_child() -> None:
    """Ctrl-C on ``status --watch`` while a read waits: the child is killed, not left behind."""
    import os
    import signal
    import threading

    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own Ctrl-C
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            gcs_prestart.finish(child, None, timeout_s=30)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, saved)
        child.kill()
        child.wait(timeout=10)
        for stream in (child.stdout, child.stderr):
            assert stream is not None
            stream.close()
