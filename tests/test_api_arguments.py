"""The Python API refuses every bad argument up front with :class:`rayscope.RayscopeError`
(a usage error, exit 2), in one line that names the argument: never another exception,
never an internal error (exit 70), never a read of the cluster first.

Before: ``gcs=6379`` and ``gcs=b"..."`` raised internal errors (``AttributeError``,
``TypeError``, exit 70), ``timeout=10**400`` an ``OverflowError`` (exit 70), a host with a
NUL or of 100,000 characters went on to the read, and ``fit(shape=[("GPU", 1)])`` answered
"does not fit" for a list it should have refused.
"""

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

import rayscope
from rayscope.client import api
from rayscope.client import head as client
from rayscope.errors import EXIT_USAGE
from tests import scenarios
from tests.support.fake_head import fake_head
from tests.support.ports import refused_port

NOWHERE = f"http://127.0.0.1:{refused_port()}"
"""A head URL where a connect is refused (the reads are replaced, but for
:func:`test_an_unreachable_head_is_a_failure_of_the_read_not_of_the_arguments`, which dials it)."""

FUNCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "cluster_state": rayscope.cluster_state,
    "fit": rayscope.fit,
    "usage": rayscope.usage,
}
BASE: dict[str, dict[str, Any]] = {
    "cluster_state": {"head": NOWHERE, "timeout": 2.0},
    "fit": {"gpu_memory_mb": 4096, "head": NOWHERE, "timeout": 2.0},
    "usage": {"head": NOWHERE, "timeout": 2.0},
}
"""Arguments each function takes, to which one bad one is added."""


class Contacted(Exception):
    """The call went on to read the cluster."""


@pytest.fixture
def no_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every read of a cluster replaced by one that records it and raises :class:`Contacted`."""
    reads: list[str] = []

    def read(*args: object, **kwargs: object) -> Any:
        reads.append(repr(args)[:200])
        raise Contacted("read")

    monkeypatch.setattr(api, "read_status", read)
    monkeypatch.setattr(client, "read_usage", read)
    yield reads


TEXT_ARGUMENTS = {
    "cluster_state": ("gcs", "head", "token_file", "dashboard"),
    "fit": ("gcs", "head", "token_file"),
    "usage": ("head", "token_file"),
}
BAD_TEXT: list[object] = [
    6379,
    b"127.0.0.1:6379",
    "127.0.0.1\x00:6379",
    "h" * 100_000,
    True,
    ["127.0.0.1"],
    "",
    "  ",
    3.5,
]

BIG = 10**400
"""Larger than any float: ``float(BIG)`` raises ``OverflowError``."""
NUMBER_ARGUMENTS: dict[str, dict[str, list[object]]] = {
    "cluster_state": {"timeout": []},
    "fit": {
        "timeout": [],
        "gpu_memory_mb": [0, -2, 1.5, 2.0**30, True, False, "4096", b"4096"],
        "replicas": [0, -1, 1.5, True, "2", None],
        "num_cpus": [-1, True, "1", None],
        "memory_mb": [-1, True, "1", None, 2.0**40],
    },
    "usage": {"timeout": [], "window": [0, -1, True, b"30m", "30m\x00", "x" * 100_000, "", [30], 10**12]},
}
BAD_NUMBERS: list[object] = [BIG, -BIG, math.nan, math.inf, -math.inf, [5], complex(1, 0), object()]
BAD_TIMEOUTS: list[object] = [0, -1, 86_401, True, False, "5", b"5", None, -0.0]


def _bad_cases() -> Iterator[Any]:
    for function, names in TEXT_ARGUMENTS.items():
        for name in names:
            for value in BAD_TEXT:
                yield pytest.param(function, name, value, id=f"{function}-{name}-{_id(value)}")
    for function, numbers in NUMBER_ARGUMENTS.items():
        for name, extra in numbers.items():
            for value in [*BAD_NUMBERS, *extra, *(BAD_TIMEOUTS if name == "timeout" else [])]:
                yield pytest.param(function, name, value, id=f"{function}-{name}-{_id(value)}")


def _id(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**20:
        return "huge" if value > 0 else "-huge"
    text = repr(value)
    return text if len(text) < 24 else f"{text[:12]}...({len(text)})"


def _call(function: str, **arguments: Any) -> dict[str, Any]:
    return FUNCTIONS[function](**arguments)


def _refused(function: str, name: str, **arguments: Any) -> str:
    """The call's one-line usage error, which names ``name``."""
    with pytest.raises(rayscope.RayscopeError) as caught:
        _call(function, **arguments)
    message = str(caught.value)
    assert type(caught.value) is rayscope.RayscopeError
    assert caught.value.exit_code == EXIT_USAGE, message
    assert "internal error" not in message and "\n" not in message, message
    assert f"{name}=" in message, message
    assert len(message) < 400, f"{len(message)} characters"
    return message


@pytest.mark.parametrize(("function", "name", "value"), list(_bad_cases()))
def test_a_bad_argument_is_refused_before_any_read(
    function: str, name: str, value: object, no_reads: list[str]
) -> None:
    arguments = dict(BASE[function])
    if name == "gcs":
        arguments.pop("head")
    arguments[name] = value
    _refused(function, name, **arguments)
    assert no_reads == []


@pytest.mark.parametrize(
    "shape",
    [
        [("GPU", 1)],
        (("GPU", 1),),
        "GPU",
        '{"GPU": 1}',
        {"GPU": "1"},
        {"GPU": math.nan},
        {"GPU": math.inf},
        {"GPU": -1},
        {"GPU": BIG},
        {"GPU": True},
        {1: 1},
        {b"GPU": 1},
        {"GPU\x00": 1},
        {"": 1},
        {"g" * 100_000: 1},
        {},
        {"CPU": 0},
        {"GPU": 1.5},
        {"nonsense": 1},
        {f"accelerator_type:{i}": 1 for i in range(1000)},
    ],
    ids=_id,
)
def test_fit_refuses_a_shape_that_is_not_a_mapping_of_ray_resources(
    shape: object, no_reads: list[str]
) -> None:
    """``shape`` is a dict of Ray resource names to amounts, as documented; a list of pairs
    (what ``dict()`` would take) is not that form."""
    _refused("fit", "shape", shape=shape, head=NOWHERE, timeout=2.0)
    assert no_reads == []


@pytest.mark.parametrize(
    "selector",
    [
        [("zone", "a")],
        "zone=a",
        {"zone": 1},
        {1: "a"},
        {"zone\x00": "a"},
        {"zone": "a\x00"},
        {"z" * 100_000: "a"},
        {"zone": "a" * 100_000},
        {f"k{i}": "a" for i in range(1000)},
        {"zone": "in(a"},
    ],
    ids=_id,
)
def test_fit_refuses_a_bad_label_selector(selector: object, no_reads: list[str]) -> None:
    _refused("fit", "label_selector", gpu_memory_mb=4096, label_selector=selector, head=NOWHERE, timeout=2.0)
    assert no_reads == []


@pytest.mark.parametrize(
    ("function", "arguments", "named"),
    [
        ("cluster_state", {"gcs": "127.0.0.1:6379", "head": NOWHERE}, "gcs"),
        ("cluster_state", {"dashboard": "none", "head": NOWHERE}, "dashboard"),
        ("cluster_state", {"dashboard": "ftp://x", "gcs": "127.0.0.1"}, "dashboard"),
        ("cluster_state", {"gcs": "ray://10.0.0.1:10001"}, "gcs"),
        ("cluster_state", {"head": "ftp://10.0.0.1"}, "head"),
        ("fit", {"head": NOWHERE}, "gpu_memory_mb"),
        ("fit", {"gpu_memory_mb": 1, "shape": {"GPU": 1}, "head": NOWHERE}, "shape"),
        ("fit", {"shape": {"CPU": 1}, "num_cpus": 1, "head": NOWHERE}, "num_cpus"),
        ("fit", {"shape": {"memory": 1}, "memory_mb": 1, "head": NOWHERE}, "memory_mb"),
        ("usage", {"head": None}, "head"),
        ("usage", {"head": NOWHERE, "window": "30x"}, "window"),
    ],
)
def test_arguments_that_do_not_go_together_are_refused(
    function: str, arguments: dict[str, Any], named: str, no_reads: list[str]
) -> None:
    _refused(function, named, timeout=2.0, **arguments)
    assert no_reads == []


@pytest.mark.parametrize(
    ("function", "arguments"),
    [
        ("cluster_state", {"gcs": "127.0.0.1:6379"}),
        ("cluster_state", {"gcs": "10.0.0.1"}),
        ("cluster_state", {"gcs": "[::1]:6379"}),
        ("cluster_state", {"gcs": " 10.0.0.1:6379 "}),
        ("cluster_state", {}),
        ("cluster_state", {"head": "http://127.0.0.1:7532", "token_file": "/etc/rayscope/token"}),
        ("cluster_state", {"head": "127.0.0.1:7532", "token_file": Path("/etc/rayscope/token")}),
        ("cluster_state", {"dashboard": "none"}),
        ("cluster_state", {"dashboard": "NONE"}),
        ("cluster_state", {"dashboard": "http://127.0.0.1:8265"}),
        ("cluster_state", {"dashboard": "https://dash.example/ray"}),
        ("cluster_state", {"dashboard": "127.0.0.1"}),
        ("cluster_state", {"timeout": 5}),
        ("cluster_state", {"timeout": 0.001}),
        ("cluster_state", {"timeout": 86_400}),
        ("fit", {"gpu_memory_mb": -1}),
        ("fit", {"gpu_memory_mb": 4096.0, "replicas": 2.0}),
        ("fit", {"gpu_memory_mb": 1 << 20, "replicas": 100_000, "num_cpus": 1.5, "memory_mb": 1024}),
        ("fit", {"shape": {"GPU": 0.5, "CPU": 1}}),
        ("fit", {"shape": {"GPU": 2, "memory": 1 << 30, "accelerator_type:A100": 0.001}}),
        ("fit", {"gpu_memory_mb": 4096, "label_selector": {"zone": "!in(a,b)"}}),
        ("fit", {"gpu_memory_mb": 4096, "label_selector": {}}),
        ("usage", {"head": "http://127.0.0.1:7532"}),
        ("usage", {"head": "http://127.0.0.1:7532", "window": 1800}),
        ("usage", {"head": "http://127.0.0.1:7532", "window": 1800.5}),
        ("usage", {"head": "http://127.0.0.1:7532", "window": "30m", "token_file": "/t"}),
    ],
)
def test_good_arguments_go_on_to_the_read(
    function: str, arguments: dict[str, Any], no_reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positive control: the validator refuses nothing the API documents; the call reaches
    the read (here replaced: an internal error saying so)."""
    monkeypatch.delenv("RAYSCOPE_DASHBOARD", raising=False)
    with pytest.raises(rayscope.RayscopeError, match="internal error: Contacted"):
        _call(function, **arguments)
    assert len(no_reads) == 1


def test_the_api_answers_a_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control, not replaced: each call against a fake head's answer."""
    monkeypatch.delenv("RAYSCOPE_TOKEN_FILE", raising=False)
    with fake_head(scenarios.seed_status()) as head:
        state = rayscope.cluster_state(head=head.url, timeout=5.0)
        answer = rayscope.fit(gpu_memory_mb=1024, head=head.url, timeout=5.0)
    assert state["nodes"] and isinstance(answer["fits"], bool)


def test_an_unreachable_head_is_a_failure_of_the_read_not_of_the_arguments() -> None:
    """Good arguments, nothing listening: the read's own failure, within the timeout."""
    started = time.monotonic()
    for call in (rayscope.cluster_state, rayscope.usage):
        with pytest.raises(rayscope.RayscopeError) as caught:
            call(head=NOWHERE, timeout=2.0)
        assert "=" not in str(caught.value).split(":", 1)[0] and "internal error" not in str(caught.value)
    assert time.monotonic() - started < 10


def test_the_command_lines_shape_refuses_a_number_too_large_for_a_float() -> None:
    """The same hole on the command line: ``fit --shape '{"GPU": 1000...0}'`` (400 digits:
    a JSON integer, not a float) exited 70 with ``OverflowError``."""
    from tests.conftest import run_rayscope

    done = run_rayscope("fit", "--shape", '{"GPU": 1%s}' % ("0" * 400), "--head", NOWHERE, timeout=30)
    assert (done.returncode, done.stderr) == (2, "rayscope: --shape: GPU: not a finite number\n")
