"""A program that uses rayscope as a library, as BioEngine's cluster actor would: it imports
``rayscope`` and uses its public names only (``tests/test_live_api.py`` checks that it does),
and prints one JSON document of what it got, for the test that runs it in its own process.

``python tests/consumer.py GCS_ADDRESS CLOSED_ADDRESS``: the cluster's state, whether a 4096 MB
app fits, the error a cluster that is not there (``CLOSED_ADDRESS``, where a connect is refused:
the caller holds it, ``tests/support/ports.py``'s ``refused_port``) raises, and whether ray was
imported by this process.
"""

import json
import sys

import rayscope


def main(gcs: str, unreachable_gcs: str) -> None:
    state = rayscope.cluster_state(gcs=gcs, timeout=30.0)
    answer = rayscope.fit(gpu_memory_mb=4096, gcs=gcs, timeout=30.0)
    try:
        rayscope.fit(gpu_memory_mb=4096, gcs=unreachable_gcs, timeout=5.0)
        error = None
    except rayscope.RayscopeError as err:
        error = str(err)
    doc = {
        "version": rayscope.__version__,
        "state": state,
        "fit": answer,
        "error": error,
        "ray_imported": "ray" in sys.modules,
    }
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
