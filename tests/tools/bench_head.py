"""A head agent that holds a synthetic cluster, for ``make bench``'s 10,000-node figures.

No GCS here serves 10,000 nodes, so the head's poller reads them from a stand-in that
returns the synthetic scheduler view every round (as a GCS read would: the same code keeps
it, marks it fresh, tells known nodes from unknown). Everything else is the real head: the
reports arrive over the real wire, the HTTP port answers ``status --head`` and ``curl``.

    python -m tests.tools.bench_head --nodes 10000 --listen 127.0.0.1:P --http 127.0.0.1:Q --token-file F
"""

import argparse
import asyncio
import logging
from pathlib import Path

from rayscope.head.daemon import Head
from rayscope.net import tokens
from rayscope.schema.pending import PendingRead
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import ActorBooking, RayNode
from tests.tools.bench import synthetic_reports, synthetic_views


class SyntheticGcs:
    """What the poller asks a ``GcsReader`` for, answered from the synthetic view."""

    versions = None

    def __init__(self, views: list[RayNode]) -> None:
        self.views = views

    def read(self) -> tuple[list[RayNode], SourceStatus]:
        return self.views, SourceStatus(name="gcs", ok=True, detail="synthetic")

    def read_actors(self) -> tuple[list[ActorBooking], SourceStatus]:
        return [], SourceStatus(name="gcs_actors", ok=True)

    def read_pending(self) -> tuple[PendingRead, SourceStatus]:
        return PendingRead(), SourceStatus(name="gcs_pending", ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--http", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--interval", type=float, default=60.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    host, port = args.listen.rsplit(":", 1)
    http_host, http_port = args.http.rsplit(":", 1)
    token = tokens.read_token(str(Path(args.token_file)))
    head = Head((host, int(port)), (http_host, int(http_port)), None, args.interval, token)
    head._reader = SyntheticGcs(synthetic_views(synthetic_reports(args.nodes)))  # type: ignore[assignment]
    asyncio.run(head.serve())


if __name__ == "__main__":
    main()
