"""A saved usage window (``--usage-state``) full in every slot, for the head's load tests and bench."""

import time
from pathlib import Path

import msgspec

from rayscope.schema.usage import SavedActor, SavedDevice, SavedUsage

ACTORS = 1000


SLOTS = 720


INTERVAL_S = 5.0


def full_window(path: Path, actors: int = ACTORS) -> None:
    """A state file of ``actors`` actors, one GPU each, a sample in every slot of the window."""
    now = time.time()
    history = SavedUsage(
        saved_at=now,
        slot_s=INTERVAL_S,
        known_since=now - SLOTS * INTERVAL_S,
        actors=[
            SavedActor(
                actor_id=f"{a:032x}",
                name=f"replica-{a}",
                class_name=f"ServeReplica:app{a % 5}:Model",
                node_id=f"{a // 100:056x}",
                booked_vram_mb=4096.0,
                booked_gpu=0.01,
                booked_mb=4096.0,
                first_seen_s_ago=SLOTS * INTERVAL_S,
                devices=[
                    SavedDevice(
                        device=f"GPU-{a // 100:08x}-0000-0000-0000-000000000000",
                        values=[(a % 7 + s % 11 + 1) * 100_000_000 for s in range(SLOTS)],
                        counts=[1] * SLOTS,
                    )
                ],
            )
            for a in range(actors)
        ],
    )
    path.write_bytes(msgspec.json.encode(history))
    path.chmod(0o600)
