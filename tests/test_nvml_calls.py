"""The one NVML call wrapper (:func:`rayscope.sources.nvml.calls.query`, nvitop's ``nvmlQuery``)
and the three policies its readers ask of it: a device field keeps every refusal as an error,
a mode keeps only real failures (Not Supported and Function Not Found are absent), a health
field keeps none and ends the read only when the GPU is lost.

Positive control: make ``query`` drop the ``quiet`` check (record every refusal) and
:func:`test_a_quiet_code_is_absent_not_an_error` fails; make it ignore ``lost`` and
:func:`test_a_lost_gpu_ends_a_health_read` fails.
"""

from typing import Callable, NoReturn

import pynvml
import pytest

from rayscope.sources.nvml.calls import ABSENT, LIBRARY_TOO_OLD, TOO_OLD, GpuLost, query


def refused(code: int) -> Callable[[], NoReturn]:
    def read() -> NoReturn:
        raise pynvml.NVMLError(code)

    return read


def test_a_value_passes_and_keeps_no_error() -> None:
    errors: dict[str, str] = {}
    assert query(errors, "temperature_c", lambda: 41) == 41
    assert errors == {}


def test_a_refusal_is_none_with_nvmls_reason() -> None:
    errors: dict[str, str] = {}
    assert query(errors, "power_draw_mw", refused(pynvml.NVML_ERROR_NOT_SUPPORTED)) is None
    assert errors == {"power_draw_mw": "Not Supported"}


def test_a_quiet_code_is_absent_not_an_error() -> None:
    errors: dict[str, str] = {}
    assert query(errors, "compute_mode", refused(pynvml.NVML_ERROR_NOT_SUPPORTED), quiet=ABSENT) is None
    assert errors == {}
    assert query(errors, "compute_mode", refused(pynvml.NVML_ERROR_UNKNOWN), quiet=ABSENT) is None
    assert errors == {"compute_mode": "Unknown Error"}


def test_an_old_library_or_pynvml_is_function_not_found() -> None:
    def too_old() -> NoReturn:
        raise LIBRARY_TOO_OLD("no such entry point")

    def no_such_call() -> int:
        return int(pynvml.nvmlDeviceGetNoSuchQuery())

    for read in (too_old, no_such_call):
        errors: dict[str, str] = {}
        assert query(errors, "field", read) is None
        assert errors == {"field": TOO_OLD}
        assert query(errors, "mode", read, quiet=ABSENT) is None
        assert "mode" not in errors


def test_without_an_errors_dict_every_refusal_is_quiet() -> None:
    assert query(None, "ecc", refused(pynvml.NVML_ERROR_NO_PERMISSION), lost=True) is None


def test_a_lost_gpu_ends_a_health_read() -> None:
    with pytest.raises(GpuLost):
        query(None, "ecc", refused(pynvml.NVML_ERROR_GPU_IS_LOST), lost=True)
    errors: dict[str, str] = {}
    assert query(errors, "name", refused(pynvml.NVML_ERROR_GPU_IS_LOST)) is None
    assert errors == {"name": "GPU is lost"}
