"""Numbers from outside are parsed in one place (``rayscope.units``), ASCII
digits only, and nothing in the package asks ``str.isdigit()`` (true for ``'²'``, which
``int()`` refuses) or its cousins.

Before (SECURITY.md): ``rollup.sort_key`` raised on a node at ``10.0.0.²`` and
``placement.match_visible`` on ``CUDA_VISIBLE_DEVICES=²,³`` (every view of the head: HTTP
500); ``parse_address`` raised ``ValueError: invalid literal`` on port ``²`` instead of its
message; ``٢`` (Arabic-Indic two) passed everywhere as 2; a raylet's ``--static_resource_list``
entry ``nan`` made the agent's whole report one the head refuses.
"""

import ast
from pathlib import Path

import pytest

from rayscope.core import rollup
from rayscope.core.gpu import placement
from rayscope.core.usage.summary import parse_window
from rayscope.errors import AgentError
from rayscope.net.addresses import parse_address, split_address
from rayscope.node.cuda_samples import interval_from_env
from rayscope.schema.report import GpuDevice, RayletInfo
from rayscope.schema.status import NodeStatus
from rayscope.sources.procs import parse_core_log_name, parse_worker_log_name
from rayscope.sources.raylet import parse_resource_list
from rayscope.units import is_count, parse_amount, parse_count
from tests.scenarios import T4, head_view, report, view

AGENT = Path(__file__).resolve().parent.parent / "agent"
FOREIGN = ("²", "٢", "５", "¹⁰", "1²", "٣٣")
"""Digits ``str.isdigit()`` takes and ASCII does not have."""
DIGIT_TESTS = ("isdigit", "isdecimal", "isnumeric")


def digit_tests(source: str) -> list[int]:
    """Lines of ``source`` that call ``.isdigit()``, ``.isdecimal()`` or ``.isnumeric()``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in DIGIT_TESTS
    ]


def test_no_module_asks_isdigit() -> None:
    """Every number from outside goes through ``rayscope.units.parse_count``/``parse_amount``.
    Goes green once every helper's branch of this change is merged (http.py, session.py,
    page.py and head_request.py are theirs)."""
    found = {
        str(path.relative_to(AGENT.parent)): lines
        for path in sorted(AGENT.rglob("*.py"))
        if (lines := digit_tests(path.read_text()))
    }
    assert found == {}


def test_the_grep_finds_the_pattern() -> None:
    """Positive control of the check above (a docstring that names it does not count)."""
    assert digit_tests('"""x.isdigit()"""\nif port.isdigit():\n    pass\n') == [2]


@pytest.mark.parametrize("text", [*FOREIGN, "", " 5", "5 ", "+5", "-5", "1_0", "0x1", "1" * 20])
def test_a_count_is_ascii_digits_and_nothing_else(text: str) -> None:
    assert not is_count(text)
    with pytest.raises(ValueError, match="port"):
        parse_count(text, "port")


def test_a_count_within_its_bound() -> None:
    assert parse_count("65535", "port", 65535) == 65535
    with pytest.raises(ValueError, match="over 65535"):
        parse_count("65536", "port", 65535)


@pytest.mark.parametrize(
    "text", [*FOREIGN, "", ".", "nan", "inf", "-1", "+1", "1_0", " 1", "1e", "1e999", "5e1234", "0x10"]
)
def test_an_amount_is_ascii_digits_a_point_and_an_exponent(text: str) -> None:
    with pytest.raises(ValueError, match="headroom"):
        parse_amount(text, "headroom")


@pytest.mark.parametrize(
    ("text", "value"), [("24576", 24576.0), ("0.5", 0.5), (".5", 0.5), ("1e3", 1e3), ("1E-3", 1e-3)]
)
def test_an_amount(text: str, value: float) -> None:
    assert parse_amount(text, "x") == value


def node_at(ip: str) -> NodeStatus:
    status = head_view([view(T4, ip, {"CPU": 1}, {"CPU": 1})], {})
    return status.nodes[T4]


@pytest.mark.parametrize("ip", ["10.0.0.²", "¹⁰.⁰.⁰.⁵", "10.0.0.٢"])
def test_a_node_at_a_foreign_digit_address_sorts_as_a_name(ip: str) -> None:
    """Before: ``ValueError: invalid literal for int()`` for ``²`` (every view of the head);
    ``10.0.0.٢`` sorted as 10.0.0.2."""
    assert rollup.sort_key(node_at(ip))[1:3] == ((256,), ip)
    assert rollup.sort_key(node_at("10.0.0.2"))[1] == (10, 0, 0, 2)


@pytest.mark.parametrize("visible", ["²,³", "٢,٣", "５,６"])
def test_cuda_visible_devices_in_foreign_digits_names_no_index(visible: str) -> None:
    """Before: ``int('²')`` raised (HTTP 500 on every ``?gpus=1`` view); ``٢`` was index 2."""
    raylet = RayletInfo(
        pid=1, node_id=T4, node_ip="10.0.0.5", cuda_visible_devices=visible, environ_read=True
    )
    gpus = [GpuDevice(index=i, uuid=f"GPU-{i}", pci_bus_id=f"0000:0{i}:00.0") for i in range(4)]
    matched = placement.match_visible(2, raylet, gpus)
    assert [(entry, gpu) for entry, gpu, _ in matched] == [(visible[0], None), (visible[2], None)]
    assert all(how.startswith("ambiguous: no NVML device has UUID") for _, _, how in matched)


@pytest.mark.parametrize("port", ["²", "٢٢", "６３７９", "+80", " 80", "8_0", "9" * 30])
def test_an_address_with_a_foreign_port_is_refused_with_its_message(port: str) -> None:
    """Before: ``²`` raised ``invalid literal for int()``; ``٢٢`` passed as port 22."""
    with pytest.raises(ValueError, match="port must be a number from 1 to 65535"):
        parse_address(f"10.0.0.1:{port}")
    assert parse_address("10.0.0.1:6379") == "10.0.0.1:6379"
    with pytest.raises(ValueError, match="not a number"):
        split_address(f"10.0.0.1:{port}")


def test_a_raylets_resource_list_keeps_ascii_amounts_only() -> None:
    """Before: ``nan`` and ``٢`` were kept (a NaN makes the whole report one the head refuses)."""
    text = "CPU,8,GPU,٢,VRAM_MB,nan,memory,1e10,x,-1,y,1_0"
    assert parse_resource_list(text) == {"CPU": 8.0, "memory": 1e10}


def test_pids_in_log_names_are_ascii() -> None:
    assert parse_worker_log_name("worker-ab-01-4242.out") == ("ab", "01", 4242)
    assert parse_worker_log_name("worker-ab-01-٤٢.out") is None
    assert parse_worker_log_name("worker-ab-01-" + "9" * 5000 + ".out") is None  # int() would raise
    assert parse_core_log_name("python-core-worker-ab_42.log") == ("ab", 42)
    assert parse_core_log_name("python-core-worker-ab_٤٢.log") is None


@pytest.mark.parametrize("text", ["١٥", "nan", "inf", "1_5"])
def test_the_cuda_sample_interval_is_ascii(text: str) -> None:
    """Before: ``RAYSCOPE_CUDA_SAMPLE_S=١٥`` was 15 s."""
    with pytest.raises(AgentError, match="RAYSCOPE_CUDA_SAMPLE_S"):
        interval_from_env({"RAYSCOPE_CUDA_SAMPLE_S": text})
    assert interval_from_env({"RAYSCOPE_CUDA_SAMPLE_S": "15"}) == 15.0


@pytest.mark.parametrize("text", ["٥m", "１h", "1_0s", "nan", "inf"])
def test_a_usage_window_is_ascii(text: str) -> None:
    """``/v1/usage?window=`` and ``usage --window``: before, ``٥m`` was five minutes."""
    with pytest.raises(ValueError, match="not a window"):
        parse_window(text)
    assert parse_window("5m") == 300.0


def test_reports_are_still_merged() -> None:
    """The fixes change nothing for ASCII text: an agent's node sorts by its address."""
    status = head_view([view(T4, "10.0.0.5", {"CPU": 1}, {"CPU": 1})], {T4: report(T4, [], "10.0.0.5")})
    assert rollup.sort_key(status.nodes[T4])[1] == (10, 0, 0, 5)
