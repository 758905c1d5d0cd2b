"""What one CUDA sample costs on this host's GPUs: ``python -m tests.tools.measure_cuda_context``.

For each GPU NVML lists, a child (the sampler's own ``cuda_read`` code, under ``python -I``)
retains the primary context, reads ``cuMemGetInfo_v2`` and then waits while the parent reads
NVML: the child's own entry in the compute process list (the driver's account of that
context's device memory), and the device's used memory before, while the context lives,
and after the child exited. One line per GPU, then the wall time of a whole sample.

Needs a real driver (or the fakes: LD_LIBRARY_PATH naming both, which checks the script, not
a GPU). Not part of the test suite: the figures are for the README.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Optional

import pynvml

from rayscope.sources.cuda import read as cuda_read
from rayscope.sources.cuda import sample as cuda
from rayscope.sources.nvml import modes as nvml_modes

MIB = 1024**2

HOLD = """
import json, sys, types
m = types.ModuleType("cuda_read")
exec(compile(SOURCE, "cuda_read", "exec"), m.__dict__)
driver = m.Driver("libcuda.so.1")
driver.call(("cuInit",), 0)
devices = m.list_devices(driver)
index, how = m.match_devices([{"uuid": UUID}], devices)[UUID]
if index is None:
    print(json.dumps({"error": how}), flush=True)
    sys.exit(1)
device = next(d["device"] for d in devices if d["index"] == index)
ctx = m.ctypes.c_void_p()
driver.call(("cuDevicePrimaryCtxRetain",), m.ctypes.byref(ctx), device)
driver.call(("cuCtxSetCurrent",), ctx)
free, total = m.ctypes.c_size_t(), m.ctypes.c_size_t()
driver.call(("cuMemGetInfo_v2",), m.ctypes.byref(free), m.ctypes.byref(total))
print(json.dumps({"free": free.value, "total": total.value}), flush=True)
sys.stdin.readline()  # hold the context until the parent has read NVML
"""


def used_bytes(handle: Any) -> int:
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used)
    except pynvml.NVMLError:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def own_entry(handle: Any, pid: int) -> Optional[int]:
    """The child's used memory in NVML's compute list, when the driver lists it."""
    for call in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
        try:
            entries = getattr(pynvml, call)(handle)
        except (pynvml.NVMLError, AttributeError):
            continue
        for entry in entries:
            if int(entry.pid) == pid and entry.usedGpuMemory is not None:
                return int(entry.usedGpuMemory)
        return None
    return None


def measure(handle: Any, uuid: str) -> str:
    source = cuda_read.__loader__.get_source(cuda_read.__name__)  # type: ignore[union-attr]
    program = f"SOURCE = {source!r}\nUUID = {uuid!r}\n{HOLD}"
    before = used_bytes(handle)
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", program],
        cwd="/",
        env=cuda.cuda_child_env(
            os.environ, {k: v for k, v in os.environ.items() if k.startswith("RAYSCOPE_FAKE")}
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        answer = json.loads(child.stdout.readline() or "{}")
        ready_s = time.monotonic() - started
        during = used_bytes(handle)
        entry = own_entry(handle, child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    time.sleep(0.5)  # the driver frees the context's memory after the process exits
    after = used_bytes(handle)
    if "free" not in answer:
        return f"{uuid}: no sample ({answer.get('error', 'child failed')})"
    listed = "not listed" if entry is None else f"{entry / MIB:.0f} MiB"
    return (
        f"{uuid}: context ready in {ready_s * 1000:.0f} ms; child's NVML entry {listed};"
        f" device used {before / MIB:.0f} -> {during / MIB:.0f} -> {after / MIB:.0f} MiB"
        f" (delta {(during - before) / MIB:+.0f} MiB); CUDA free {answer['free'] / MIB:.0f}"
        f" of {answer['total'] / MIB:.0f} MiB"
    )


def request(handle: Any, uuid: str) -> cuda.CudaRequest:
    """What the node agent would ask: NVML's compute mode and free memory."""
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return cuda.CudaRequest(
        uuid=uuid,
        compute_mode=nvml_modes.compute_mode(handle, {}),
        free_bytes_readings=(int(info.free),),
    )


def main() -> int:
    pynvml.nvmlInit()
    requests = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        asked = request(handle, uuid)
        refused = cuda.refusal(asked, cuda.DEFAULT_CONTEXT_COST_BYTES)
        print(f"{uuid}: {refused}" if refused else measure(handle, uuid), flush=True)
        if not refused:
            requests.append(asked)
    extra = {k: v for k, v in os.environ.items() if k.startswith("RAYSCOPE_FAKE")}
    sampler = cuda.CudaSampler(0.0, 30.0, extra_env=extra)
    walls = []
    for _ in range(10):
        started = time.perf_counter()
        sampler.sample(requests)
        walls.append(time.perf_counter() - started)
    print(
        f"one sample of {len(requests)} GPU(s), 10 runs: median {statistics.median(walls) * 1000:.0f} ms,"
        f" max {max(walls) * 1000:.0f} ms (python {sys.version.split()[0]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
