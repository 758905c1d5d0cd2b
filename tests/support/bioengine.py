"""BioEngine's checks of rayscope's ``status --json`` document (its ``get_cluster_state()``),
restated in our words: the rules and where each comes from are in tests/test_bioengine_contract.py."""

from collections.abc import Iterator
from typing import Any

GIB = 1024**3


CLUSTER_NUMBERS = ("total_cpu", "used_cpu", "total_gpu", "used_gpu")


NODE_NUMBERS = (
    "total_cpu", "used_cpu", "total_gpu", "used_gpu", "total_memory", "used_memory",
    "total_object_store_memory", "used_object_store_memory",
)  # fmt: skip


GPU_MEMORY = ("total_gpu_memory", "used_gpu_memory")


INDEXED_BY_APPS = ("used_cpu", "used_gpu", "used_memory", "total_cpu", "total_gpu", "total_memory")


Document = dict[str, Any]


def is_number(value: object) -> bool:
    """What BioEngine's test accepts as a number: an int or a float (a bool is an int)."""
    return isinstance(value, (int, float))


def number_problems(where: str, block: dict[str, Any], keys: tuple[str, ...], rule: str) -> Iterator[str]:
    for key in keys:
        if key not in block:
            continue
        value = block[key]
        if not is_number(value):
            yield f"{rule} {where}.{key}: {value!r} is not a number"
        elif value < 0:
            yield f"{rule} {where}.{key}: {value!r} is negative"


def gpu_memory_problems(where: str, node: dict[str, Any]) -> Iterator[str]:
    """T10-T12: bytes, or the word ``"NA"``; ``null`` is neither."""
    for key in GPU_MEMORY:
        if key not in node:
            continue
        value = node[key]
        if isinstance(value, str):
            if value != "NA":
                yield f"T11 {where}.{key}: the only string allowed is 'NA', not {value!r}"
        elif not is_number(value):
            yield f"T10 {where}.{key}: {value!r} is neither a number nor 'NA'"
        elif value < 0:
            yield f"T12 {where}.{key}: {value!r} is negative"


def node_problems(node_id: object, node: object) -> Iterator[str]:
    where = f"nodes.{node_id}"
    if not isinstance(node_id, str):
        yield f"T6 {where}: the node id is not a string"
    if not isinstance(node, dict):
        yield f"T7 {where}: not an object"
        return
    if "node_ip" in node and not (node["node_ip"] is None or isinstance(node["node_ip"], str)):
        yield f"T8 {where}.node_ip: {node['node_ip']!r} is neither a string nor null"
    if "head" in node and not isinstance(node["head"], bool):
        yield f"T9 {where}.head: {node['head']!r} is not a bool"
    yield from gpu_memory_problems(where, node)
    yield from number_problems(where, node, NODE_NUMBERS, "T13")
    yield from number_problems(where, node, ("total_gpu", "used_gpu", "used_cpu", "total_cpu"), "C2/C3")
    yield from indexed_problems(where, node)


def indexed_problems(where: str, node: dict[str, Any]) -> Iterator[str]:
    """What BioEngine indexes in a node, and what it writes for a node without GPU."""
    if "slurm_job_id" not in node:
        yield f"P1 {where}: slurm_job_id is missing (BioEngine indexes it)"
    elif not (node["slurm_job_id"] is None or isinstance(node["slurm_job_id"], str)):
        yield f"P1 {where}.slurm_job_id: {node['slurm_job_id']!r} is neither a string nor null"
    for key in INDEXED_BY_APPS:
        if key not in node:
            yield f"P3 {where}: {key} is missing (BioEngine's app manager indexes it)"
    if is_number(node.get("total_gpu")) and node["total_gpu"] == 0:
        for key, want in (("total_gpu_memory", 0), ("used_gpu_memory", 0), ("accelerator_type", "NA")):
            if node.get(key) != want or isinstance(node.get(key), bool):
                yield f"P6 {where}.{key}: {node.get(key)!r} on a node without GPU (BioEngine writes {want!r})"


def bioengines_nodes(document: Document) -> list[dict[str, Any]]:
    """The nodes BioEngine's ``get_cluster_state`` would list: live nodes of the scheduler."""
    return [n for n in document["nodes"].values() if n.get("alive", True) and n.get("in_scheduler", True)]


def cluster_problems(document: Document) -> Iterator[str]:
    cluster = document.get("cluster")
    if not isinstance(cluster, dict):
        yield "T3 cluster: not an object"
        return
    yield from number_problems("cluster", cluster, CLUSTER_NUMBERS, "T4/C1")
    if not isinstance(document.get("nodes"), dict):
        return
    for key in GPU_MEMORY:
        value = cluster.get(key)
        numbers: list[float] = [n[key] for n in bioengines_nodes(document) if is_number(n.get(key))]
        want = sum(numbers)
        if not isinstance(value, int) or isinstance(value, bool):
            yield f"P7 cluster.{key}: {value!r} is not an int (BioEngine sums the node numbers)"
        elif value != want:
            yield f"P7 cluster.{key}: {value} is not the sum of the listed nodes' numbers ({want})"
    if "pending_resources" in cluster and not isinstance(cluster["pending_resources"], dict):
        yield f"P4 cluster.pending_resources: {cluster['pending_resources']!r}: an object or absent"


def bioengine_problems(document: Document) -> list[str]:
    """Every BioEngine rule ``document`` breaks, one line each, rule first."""
    found = list(cluster_problems(document))
    nodes = document.get("nodes")
    if not isinstance(nodes, dict):
        return [*found, "T5 nodes: not an object"]
    for node_id, node in nodes.items():
        found += node_problems(node_id, node)
    try:
        bioengine_cli_lines(document)
    except (TypeError, ValueError) as err:
        found.append(f"C1-C3 BioEngine's CLI cannot render it: {err}")
    return found


def vram(value: object) -> str:
    """BioEngine's CLI: a number as GiB with one decimal, anything else as ``NA``."""
    return f"{value / GIB:.1f}" if isinstance(value, (int, float)) else "NA"


def _where(n: dict[str, Any]) -> str:
    """A node line's start: the node's address and role."""
    return f"  {n.get('node_ip')} [{'HEAD' if n.get('head') else 'worker'}]"


def _cpu_line(n: dict[str, Any]) -> str:
    return f"CPU: {n.get('used_cpu', 0):.0f}/{n.get('total_cpu', 0):.0f}"


def _gpu_line(n: dict[str, Any]) -> str:
    return (
        f"{n.get('accelerator_type', '?')} GPU: {n.get('used_gpu', 0):.1f}/{n.get('total_gpu', 0):.0f}"
        f" VRAM: {vram(n.get('used_gpu_memory'))}/{vram(n.get('total_gpu_memory'))} GiB  {_cpu_line(n)}"
    )


def bioengine_cli_lines(document: Document) -> list[str]:
    """``bioengine cluster status`` of ``document``, as its CLI formats it (raises where it would)."""
    cluster, nodes = document["cluster"], document["nodes"]
    lines = [
        f"Cluster: {cluster.get('used_cpu', 0):.0f}/{cluster.get('total_cpu', 0):.0f} CPUs,"
        f" {cluster.get('used_gpu', 0):.1f}/{cluster.get('total_gpu', 0):.0f} GPUs"
    ]
    gpu_nodes = [n for n in nodes.values() if n.get("total_gpu", 0) > 0]
    cpu_nodes = [n for n in nodes.values() if n.get("total_gpu", 0) == 0]
    lines += ["GPU nodes:"] if gpu_nodes else []
    lines += [f"{_where(n)} {_gpu_line(n)}" for n in gpu_nodes]
    lines += ["CPU-only nodes:"] if cpu_nodes else []
    lines += [f"{_where(n)} {_cpu_line(n)}" for n in cpu_nodes]
    return lines


def assert_keeps_the_contract(document: Document) -> None:
    problems = bioengine_problems(document)
    assert not problems, "BioEngine's checks fail:\n" + "\n".join(problems)
