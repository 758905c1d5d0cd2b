"""What ``/metrics?gpus=1``'s per-device families cost at N nodes of 8 GPUs (are
they cheap enough to be the default?): the attribution the head runs before such a render,
then the Prometheus text with and without them, size (plain and gzip level 1, as the head
compresses) and render time (median of 5).

    python -m tests.tools.bench_device_metrics 10000

The cluster is tests/page_scenarios.big_status (1-3 replicas per GPU, ~20,000 actors per
1,000 nodes). Figures in deploy/prometheus/README.md.
"""

import gzip
import statistics
import sys
import time
from typing import Any, Callable

from msgspec.structs import replace

import tests.page_scenarios as scenarios
from rayscope.render.metrics import metrics_text


def median_s(fn: Callable[[], object], runs: int = 5) -> float:
    spent = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - start)
    return statistics.median(spent)


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    attributed: list[float] = []
    attribute = vars(scenarios)["attribute_cluster"]

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = attribute(*args, **kwargs)
        attributed.append(time.perf_counter() - start)
        return out

    vars(scenarios)["attribute_cluster"] = timed  # big_status calls it through its module
    full = scenarios.big_status(nodes)
    plain = replace(
        full, nodes={k: replace(n, placement=None, attribution=None) for k, n in full.nodes.items()}
    )
    print(f"{nodes} nodes x 8 GPUs: attribution (what ?gpus=1 runs first) {attributed[0]:.2f} s")
    for name, status in (("without rayscope_device_*", plain), ("with rayscope_device_*", full)):
        text = metrics_text(status)
        packed = gzip.compress(text.encode(), 1)
        took = median_s(lambda status=status: metrics_text(status))  # type: ignore[misc]
        print(
            f"  {name}: {len(text) / 1e6:.2f} MB, gzip {len(packed) / 1e6:.2f} MB, render {took * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main()
