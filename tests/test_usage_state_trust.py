"""SECURITY.md, *Local trust*: the head's ``--usage-state`` is checked as a
token file is, and what it holds is bounded by its types.

The probe: a root-owned state file of mode 0666 was read (anyone could have written the
history) and saved again 0666; ``slot_s: 1.7e308`` passed the schema and stopped the head with
``OverflowError``; 1,000 actors of 64 empty device entries each took 544 MB.
"""

import os
import stat
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rayscope.errors import AgentError
from rayscope.head.store.usage_store import open_store, read_state
from rayscope.schema.usage import SavedActor, SavedDevice, SavedUsage
from tests.reliability_plugin import FaultRecord

WALL = 1_800_000_000.0
MIB = 1024**2


def saved(actors: int = 1, devices: int = 1, values: tuple[int, ...] = (1024,), **fields: Any) -> bytes:
    """A state file: ``actors`` actors, each on ``devices`` devices holding ``values``."""
    history: dict[str, Any] = {
        "saved_at": WALL,
        "slot_s": 5.0,
        "known_since": WALL - 60,
        "actors": [
            SavedActor(
                actor_id=f"{a:032x}",
                name=f"replica-{a}",
                devices=[
                    SavedDevice(device=f"GPU-{a}-{d}", values=list(values), counts=[1] * len(values))
                    for d in range(devices)
                ],
            )
            for a in range(actors)
        ],
    }
    history.update(fields)
    return msgspec.json.encode(SavedUsage(**history))


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646, 0o620])
def test_a_state_file_others_can_write_is_refused_in_one_line(tmp_path: Path, mode: int) -> None:
    """Root's own file, but anyone (or the group) could have written the history in it.
    Positive control: drop the mode check in ``read_state`` and the history is restored
    (before the fix: restored, and saved again with mode 0666)."""
    path = tmp_path / "usage.json"
    path.write_bytes(saved())
    path.chmod(mode)
    with pytest.raises(AgentError) as err:
        open_store(3600, 5, str(path), now=0.0, wall_now=WALL)
    assert err.value.exit_code == 2
    assert str(err.value) == (
        f"cannot read --usage-state {path}: it is writable by group or others (mode {mode:03o}):"
        f" `chmod 600 {path}`"
    )
    assert stat.S_IMODE(path.stat().st_mode) == mode  # left as it was: nothing written


def test_a_state_file_is_saved_private(tmp_path: Path) -> None:
    """A new file, and one of mode 0644 (readable by all, as the umask left it before), are
    written 0600: the history holds what ``/v1/usage`` keeps behind the read token."""
    fresh = tmp_path / "fresh.json"
    open_store(3600, 5, str(fresh), now=0.0, wall_now=WALL)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    old = tmp_path / "old.json"
    old.write_bytes(saved())
    old.chmod(0o644)
    store = open_store(3600, 5, str(old), now=0.0, wall_now=WALL + 5)
    assert store.restored_from == str(old)
    assert stat.S_IMODE(old.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "fields",
    [
        {"slot_s": 1.7e308},
        {"slot_s": 0.0},
        {"saved_at": 1.7e308},
        {"known_since": 1.7e308},
        {"actors": [{"actor_id": "a", "first_seen_s_ago": 1.7e308}]},
        {"actors": [{"actor_id": "a", "booked_vram_mb": 1.7e308}]},
        {"actors": [{"actor_id": "a", "devices": [["GPU-0", [5], [-1]]]}]},
        {"actors": [{"actor_id": "a", "devices": [["GPU-0", [5], [70000]]]}]},
    ],
    ids=lambda fields: ",".join(f"{k}" for k in fields) + "=" + str(next(iter(fields.values())))[:60],
)
def test_values_out_of_bounds_are_no_history_and_never_stop_the_head(
    tmp_path: Path, fields: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Each value past its bound makes the file no usage history (logged; the head starts an
    empty one and replaces the file), never an exception at the start.
    Positive control: give ``SavedUsage.slot_s`` the plain ``Amount`` again and the first
    case raises ``OverflowError`` (before the fix: it did, and the head stopped)."""
    base = msgspec.json.decode(saved(values=(1024, 2048, 4096)))
    base.update(fields)
    path = tmp_path / "usage.json"
    path.write_bytes(msgspec.json.encode(base))
    path.chmod(0o600)
    store = open_store(3600, 5, str(path), now=0.0, wall_now=WALL)
    assert store.restored_from == "" and "is not a usage history" in caplog.text
    assert store.document(0.0).actors == []


@pytest.mark.fault
def test_a_hostile_state_file_neither_stops_nor_bloats_the_head(
    tmp_path: Path, fault: FaultRecord, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe's three files: root's of mode 0666 (refused in one line, exit 2), one with
    ``slot_s: 1.7e308`` (no history: the head starts empty), and 1,000 actors of 64 device
    entries without a sample each (nothing allocated for them: no device series, nor an actor
    without a sample). Positive control: drop the filter of empty slots in
    ``UsageWindow.restore`` and 482 MiB are traced for the last (the probe measured 544 MB of
    RSS); reading the file with ``read(MAX_STATE_BYTES + 1)`` allocated 256 MiB at every
    start too."""
    fault.expect(
        "a hostile --usage-state: mode 0666, slot_s 1.7e308, 1,000 actors x 64 empty devices (before:"
        " read and saved again 0666; OverflowError stopped the head; 482 MiB traced)",
        "refused in one line (exit 2); no history, the head starts; no memory for empty entries",
    )
    path = tmp_path / "usage.json"
    path.write_bytes(saved())
    path.chmod(0o666)
    with pytest.raises(AgentError) as err:
        open_store(3600, 5, str(path), now=0.0, wall_now=WALL)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    fault.observe(f"0666: exit {err.value.exit_code}, {str(err.value).replace(str(tmp_path), '$TMP')}")

    path.write_bytes(saved(values=(1024, 2048, 4096), slot_s=1.7e308))
    path.chmod(0o600)
    store = open_store(3600, 5, str(path), now=0.0, wall_now=WALL)
    assert store.restored_from == "" and "is not a usage history" in caplog.text
    fault.observe("slot_s 1.7e308: not a usage history, the head starts with an empty one")

    path.write_bytes(saved(actors=1000, devices=64, values=()))
    tracemalloc.start()
    try:
        store = open_store(3600, 5, str(path), now=0.0, wall_now=WALL)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.window.actors == {}
    assert peak < 64 * MIB
    path.write_bytes(saved(actors=2, devices=3, values=(-1, -1)))
    assert open_store(3600, 5, str(path), now=0.0, wall_now=WALL).window.actors == {}
    fault.observe(
        f"1,000 x 64 empty devices: peak {peak / MIB:.1f} MiB traced while restoring, 0 series kept"
    )


def test_read_state_still_reads_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    path.write_bytes(saved(actors=2, devices=2, values=(1024, -1, 2048)))
    path.chmod(0o600)
    history = read_state(str(path))
    assert history is not None and len(history.actors) == 2
    store = open_store(3600, 5, str(path), now=0.0, wall_now=WALL)
    assert sum(len(s.devices) for s in store.window.actors.values()) == 4
    assert os.stat(path).st_uid == os.geteuid()
    assert [a.peak_used_bytes for a in store.document(0.0).actors] == [4096, 4096]  # 2 GPUs x 2048
