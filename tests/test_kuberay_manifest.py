"""The KubeRay manifest of docs/deploy.md (deploy/kuberay-raycluster.yaml): it parses, every field name
is one KubeRay's RayCluster CRD (ray.io/v1) or the Kubernetes pod spec it embeds accepts, and
the sidecars' command lines are ones rayscope accepts.

No KubeRay CRD is installable from the package registries this project uses (KubeRay ships as
a Go module and a Helm chart), so the field list below restates the parts of the CRD's
OpenAPI schema that the manifest uses, read from KubeRay's
``ray-operator/config/crd/bases/ray.io_rayclusters.yaml`` and its docs; a field outside it is
an error (a typo such as ``workerGroupSpec`` or ``minReplica`` would be silently pruned by
the API server, and the cluster would not be what docs/deploy.md says).
"""

import re
from pathlib import Path
from typing import Any, Union

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML, a dependency of ray; no stubs installed

from tests.conftest import REPO, run_rayscope

MANIFEST = REPO / "deploy" / "kuberay-raycluster.yaml"

STR, INT, BOOL = "string", "integer", "boolean"
QUANTITY = "quantity"  # Kubernetes int-or-string
MAP_OF_STR = {"*": STR}
MAP_OF_QUANTITY = {"*": QUANTITY}

Schema = Union[str, dict[str, Any], list[Any]]

CONTAINER: dict[str, Schema] = {
    "name": STR,
    "image": STR,
    "imagePullPolicy": STR,
    "command": [STR],
    "args": [STR],
    "env": [{"name": STR, "value": STR}],
    "ports": [{"containerPort": INT, "name": STR, "protocol": STR}],
    "resources": {"limits": MAP_OF_QUANTITY, "requests": MAP_OF_QUANTITY},
    "volumeMounts": [{"name": STR, "mountPath": STR, "readOnly": BOOL}],
}
POD_TEMPLATE: dict[str, Schema] = {
    "metadata": {"labels": MAP_OF_STR, "annotations": MAP_OF_STR},
    "spec": {
        "shareProcessNamespace": BOOL,
        "containers": [CONTAINER],
        "volumes": [{"name": STR, "secret": {"secretName": STR, "defaultMode": INT}}],
        "nodeSelector": MAP_OF_STR,
    },
}
RAYCLUSTER: dict[str, Schema] = {
    "apiVersion": STR,
    "kind": STR,
    "metadata": {"name": STR, "namespace": STR, "labels": MAP_OF_STR},
    "spec": {
        "rayVersion": STR,
        "enableInTreeAutoscaling": BOOL,
        "headGroupSpec": {
            "serviceType": STR,
            "rayStartParams": MAP_OF_STR,  # values are strings in the CRD, even numbers
            "template": POD_TEMPLATE,
        },
        "workerGroupSpecs": [
            {
                "groupName": STR,
                "replicas": INT,
                "minReplicas": INT,
                "maxReplicas": INT,
                "rayStartParams": MAP_OF_STR,
                "template": POD_TEMPLATE,
            }
        ],
    },
}
REQUIRED = {  # the CRD's `required` lists, for the objects the manifest has
    "spec": ["headGroupSpec"],
    "spec.headGroupSpec": ["template"],
    "spec.workerGroupSpecs[]": ["groupName", "template"],
    "spec.headGroupSpec.template.spec": ["containers"],
    "spec.workerGroupSpecs[].template.spec": ["containers"],
}


def schema_errors(value: Any, schema: Schema, path: str) -> list[str]:
    """Every field name or type in ``value`` that ``schema`` does not allow."""
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [e for item in value for e in schema_errors(item, schema[0], f"{path}[]")]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected an object"]
        errors = [f"{path}: missing {k}" for k in REQUIRED.get(path.lstrip("."), []) if k not in value]
        for key, item in value.items():
            sub = schema.get(key, schema.get("*"))
            if sub is None:
                errors.append(f"{path}.{key}: not a field of KubeRay's RayCluster CRD here")
            else:
                errors += schema_errors(item, sub, f"{path}.{key}")
        return errors
    ok = {
        STR: isinstance(value, str),
        INT: isinstance(value, int) and not isinstance(value, bool),
        BOOL: isinstance(value, bool),
        QUANTITY: isinstance(value, (int, str)) and not isinstance(value, bool),
    }[schema]
    return [] if ok else [f"{path}: {value!r} is not a {schema}"]


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return doc


def test_the_manifest_parses_as_a_raycluster(manifest: dict[str, Any]) -> None:
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"


def test_every_field_is_one_kuberay_knows(manifest: dict[str, Any]) -> None:
    assert schema_errors(manifest, RAYCLUSTER, "") == []


def test_the_check_catches_a_misspelt_field(manifest: dict[str, Any]) -> None:
    """Positive control for the schema walk: a typo KubeRay would prune, and a number where
    the CRD takes a string."""
    spec = dict(manifest["spec"])
    spec["workerGroupSpec"] = spec.pop("workerGroupSpecs")
    spec["headGroupSpec"] = {**spec["headGroupSpec"], "rayStartParams": {"num-cpus": 4}}
    errors = schema_errors({**manifest, "spec": spec}, RAYCLUSTER, "")
    assert ".spec.workerGroupSpec: not a field of KubeRay's RayCluster CRD here" in errors
    assert ".spec.headGroupSpec.rayStartParams.num-cpus: 4 is not a string" in errors


def sidecars(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [manifest["spec"]["headGroupSpec"], *manifest["spec"]["workerGroupSpecs"]]
    found = [c for g in groups for c in g["template"]["spec"]["containers"] if c["name"] == "rayscope"]
    assert len(found) == len(groups)  # one sidecar in the head group and in every worker group
    return found


def test_sidecars_run_commands_rayscope_accepts(manifest: dict[str, Any]) -> None:
    """Every option a sidecar passes is in its command's ``--help`` (a renamed option fails)."""
    for container in sidecars(manifest):
        command, *args = container["args"]
        done = run_rayscope(command, "--help")
        assert done.returncode == 0, done.stderr
        for option in (a for a in args if a.startswith("--")):
            assert re.search(rf"{re.escape(option)}\b", done.stdout), f"{command} has no {option}"


def test_workers_report_to_the_head_service_on_a_port_it_exposes(manifest: dict[str, Any]) -> None:
    """KubeRay names the head's service ``<cluster>-head-svc`` and gives it the head
    container's ports: the report port must be among them."""
    head, *workers = sidecars(manifest)
    listen_port = head["args"][head["args"].index("--listen") + 1].rsplit(":", 1)[1]
    ray_head = manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert int(listen_port) in [p["containerPort"] for p in ray_head["ports"]]
    for worker in workers:
        target = worker["args"][worker["args"].index("--head") + 1]
        assert target == f"{manifest['metadata']['name']}-head-svc:{listen_port}"


def test_the_deploy_page_shows_this_manifest() -> None:
    page = (REPO / "docs" / "deploy.md").read_text()
    assert "](../deploy/kuberay-raycluster.yaml)" in page
    assert Path(MANIFEST).is_file()
