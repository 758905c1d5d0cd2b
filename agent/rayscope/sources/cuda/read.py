"""One CUDA memory sample: run as ``python -I -c SOURCE LIBRARY REQUESTS_JSON`` by
:mod:`rayscope.sources.cuda.sample`, in a child process that exits as soon as it has answered.

Standard library only (ctypes), so it runs as a script with no rayscope on the path. It loads
the CUDA driver library ``LIBRARY`` (the absolute path the parent resolved from trusted
directories, :mod:`rayscope.sources.libraries`; the name only when none holds it), lists CUDA's
devices with their UUIDs and PCI bus ids, matches them to the requested NVML devices (by UUID,
else by a PCI bus id only one CUDA device has; never by index), and on each matched device
retains the primary context, reads ``cuMemGetInfo_v2`` (device-wide free and total bytes as
CUDA sees them while this context lives) and releases it. It prints one JSON document on
stdout::

    {"ok": true, "driver_version": 12040,
     "samples": {"GPU-...": {"free_bytes": N, "total_bytes": N, "cuda_index": 0,
                             "matched_by": "uuid"}
                 "GPU-...": {"error": "..."}}}

or ``{"ok": false, "error": "..."}`` when CUDA itself did not answer (no library, cuInit
failed). ``REQUESTS_JSON`` is a list of ``{"uuid": ..., "pci_bus_id": ...}``.
"""

import ctypes
import json
import sys
from typing import Any, Optional

SUCCESS = 0


class CudaError(Exception):
    """A CUDA call that did not return CUDA_SUCCESS; ``str()`` names the call and the error."""


def normalise_uuid(text: Optional[str]) -> Optional[str]:
    """The 32 hex digits of a UUID, lower case, without NVML's ``GPU-``/``MIG-`` prefix or
    dashes: the form NVML's text and CUDA's 16 bytes agree on."""
    if not text:
        return None
    body = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if body.startswith(prefix):
            body = body[len(prefix) :]
            break
    digits = body.replace("-", "")
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return digits


def uuid_text(raw: bytes) -> str:
    """CUDA's 16 UUID bytes in NVML's text form (``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``)."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def normalise_pci(text: Optional[str]) -> Optional[tuple[int, int, int, int]]:
    """(domain, bus, device, function) of a PCI bus id in NVML's (``00000000:01:00.0``) or
    CUDA's (``0000:01:00.0``) form; ``None`` when it is neither."""
    if not text:
        return None
    try:
        domain, bus, rest = text.strip().split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


def match_devices(
    requests: list[dict[str, Any]], devices: list[dict[str, Any]]
) -> dict[str, tuple[Optional[int], str]]:
    """For each requested NVML UUID: (CUDA ordinal, ``uuid`` or ``pci_bus_id``), or
    (``None``, why not). A PCI bus id is used only when no CUDA device answered with that
    UUID and exactly one CUDA device has that bus id (MIG instances share their GPU's)."""
    by_uuid = {normalise_uuid(d.get("uuid")): d["index"] for d in devices if normalise_uuid(d.get("uuid"))}
    by_pci: dict[tuple[int, int, int, int], list[int]] = {}
    for d in devices:
        pci = normalise_pci(d.get("pci_bus_id"))
        if pci is not None:
            by_pci.setdefault(pci, []).append(d["index"])
    matched: dict[str, tuple[Optional[int], str]] = {}
    for request in requests:
        uuid = str(request.get("uuid") or "")
        key = normalise_uuid(uuid)
        if key is not None and key in by_uuid:
            matched[uuid] = (by_uuid[key], "uuid")
            continue
        pci = normalise_pci(request.get("pci_bus_id"))
        candidates = by_pci.get(pci, []) if pci is not None else []
        if len(candidates) == 1 and _uuid_known_elsewhere(candidates[0], devices, key):
            matched[uuid] = (None, f"CUDA device {candidates[0]} has this PCI bus id but another UUID")
        elif len(candidates) == 1:
            matched[uuid] = (candidates[0], "pci_bus_id")
        elif len(candidates) > 1:
            matched[uuid] = (None, f"PCI bus id shared by {len(candidates)} CUDA devices and no UUID match")
        else:
            matched[uuid] = (None, f"no CUDA device with this UUID or PCI bus id ({len(devices)} seen)")
    return matched


def _uuid_known_elsewhere(index: int, devices: list[dict[str, Any]], key: Optional[str]) -> bool:
    """Whether the CUDA device ``index`` answered with a UUID other than ``key``: then its bus
    id matching is a coincidence (a renumbered bus), not the same GPU."""
    own = next((normalise_uuid(d.get("uuid")) for d in devices if d["index"] == index), None)
    return own is not None and key is not None and own != key


class Driver:
    """The few driver API calls a sample needs, through ctypes."""

    def __init__(self, library: str) -> None:
        self.lib = ctypes.CDLL(library)

    def fn(self, *names: str) -> Any:
        """The first of ``names`` the library exports (newest version first)."""
        for name in names:
            found = getattr(self.lib, name, None)
            if found is not None:
                found.restype = ctypes.c_int
                return found
        raise CudaError(f"{names[0]}: not exported by this libcuda")

    def error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        try:
            get = self.fn("cuGetErrorName")
            if get(code, ctypes.byref(name)) == SUCCESS and name.value:
                return name.value.decode("ascii", "replace")
        except CudaError:
            pass
        return f"CUDA error {code}"

    def call(self, names: tuple[str, ...], *args: Any) -> None:
        code = self.fn(*names)(*args)
        if code != SUCCESS:
            raise CudaError(f"{names[0]}: {self.error_name(int(code))}")


def list_devices(driver: Driver) -> list[dict[str, Any]]:
    """Every CUDA device: ordinal, UUID (NVML's form; ``None`` if not read), PCI bus id."""
    count = ctypes.c_int()
    driver.call(("cuDeviceGetCount",), ctypes.byref(count))
    devices = []
    for ordinal in range(count.value):
        device = ctypes.c_int()
        driver.call(("cuDeviceGet",), ctypes.byref(device), ordinal)
        raw = (ctypes.c_char * 16)()
        uuid: Optional[str] = None
        try:
            driver.call(("cuDeviceGetUuid_v2", "cuDeviceGetUuid"), raw, device)
            uuid = uuid_text(bytes(raw))
        except CudaError:
            pass
        bus = ctypes.create_string_buffer(32)
        pci: Optional[str] = None
        try:
            driver.call(("cuDeviceGetPCIBusId",), bus, 32, device)
            pci = bus.value.decode("ascii", "replace")
        except CudaError:
            pass
        devices.append({"index": ordinal, "device": device.value, "uuid": uuid, "pci_bus_id": pci})
    return devices


def memory(driver: Driver, device: int) -> tuple[int, int]:
    """(free, total) bytes on ``device``, read in its primary context, released after."""
    context = ctypes.c_void_p()
    driver.call(("cuDevicePrimaryCtxRetain",), ctypes.byref(context), device)
    try:
        driver.call(("cuCtxSetCurrent",), context)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        driver.call(("cuMemGetInfo_v2",), ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value
    finally:
        try:
            driver.call(("cuCtxSetCurrent",), None)
        finally:
            driver.call(("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), device)


def sample(library: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole answer (see the module's docstring); never raises."""
    try:
        driver = Driver(library)
    except OSError as err:
        return {"ok": False, "error": f"CUDA driver library ({library}) not loadable: {err}"}
    try:
        driver.call(("cuInit",), 0)
        version = ctypes.c_int()
        driver.call(("cuDriverGetVersion",), ctypes.byref(version))
        devices = list_devices(driver)
    except CudaError as err:
        return {"ok": False, "error": str(err)}
    ordinals = {d["index"]: d["device"] for d in devices}
    samples: dict[str, Any] = {}
    for uuid, (index, how) in match_devices(requests, devices).items():
        if index is None:
            samples[uuid] = {"error": how}
            continue
        try:
            free, total = memory(driver, ordinals[index])
        except CudaError as err:
            samples[uuid] = {"error": str(err), "cuda_index": index, "matched_by": how}
            continue
        samples[uuid] = {"free_bytes": free, "total_bytes": total, "cuda_index": index, "matched_by": how}
    return {"ok": True, "driver_version": version.value, "samples": samples}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(json.dumps({"ok": False, "error": "usage: cuda_read LIBRARY REQUESTS_JSON"}))
        return 2
    try:
        requests = json.loads(argv[2])
    except ValueError as err:
        print(json.dumps({"ok": False, "error": f"bad requests: {err}"}))
        return 2
    print(json.dumps(sample(argv[1], requests)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
