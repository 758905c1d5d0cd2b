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

import copy
import json
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional, Union

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML, a dependency of ray; no stubs installed

from tests import unit_sandbox
from tests.conftest import REPO, run_rayscope
from tests.support.ports import refused_port

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
    "env": [{"name": STR, "value": STR, "valueFrom": {"fieldRef": {"fieldPath": STR}}}],
    "ports": [{"containerPort": INT, "name": STR, "protocol": STR}],
    "resources": {"limits": MAP_OF_QUANTITY, "requests": MAP_OF_QUANTITY},
    "volumeMounts": [{"name": STR, "mountPath": STR, "readOnly": BOOL}],
    "livenessProbe": {
        "exec": {"command": [STR]},
        "initialDelaySeconds": INT,
        "periodSeconds": INT,
        "timeoutSeconds": INT,
        "failureThreshold": INT,
    },
    "securityContext": {
        "runAsNonRoot": BOOL,
        "runAsUser": INT,
        "runAsGroup": INT,
        "allowPrivilegeEscalation": BOOL,
        "readOnlyRootFilesystem": BOOL,
        "capabilities": {"drop": [STR], "add": [STR]},
        "seccompProfile": {"type": STR},
    },
}
POD_TEMPLATE: dict[str, Schema] = {
    "metadata": {"labels": MAP_OF_STR, "annotations": MAP_OF_STR},
    "spec": {
        "shareProcessNamespace": BOOL,
        "initContainers": [CONTAINER],
        "containers": [CONTAINER],
        "volumes": [
            {
                "name": STR,
                "secret": {"secretName": STR, "defaultMode": INT},
                "emptyDir": {"medium": STR, "sizeLimit": QUANTITY},
            }
        ],
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
    """Every option a sidecar passes is in its command's ``--help`` (a renamed option fails),
    the ones the worker's node-id script adds included (``push --node-id``, ``status ...``)."""
    for container in sidecars(manifest):
        command, *args = container["args"]
        script = container["command"][2] if container["command"][:2] == ["sh", "-c"] else ""
        calls = [(command, args + re.findall(r'"\$@" (--[a-z-]+)', script))]
        calls += [("status", words.split()) for words in re.findall(r'"\$0" status ([^|]*)\|', script)]
        for name, words in calls:
            done = run_rayscope(name, "--help")
            assert done.returncode == 0, done.stderr
            for option in (a for a in words if a.startswith("--")):
                assert re.search(rf"{re.escape(option)}\b", done.stdout), f"{name} has no {option}"


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


# -- the sidecar drops every privilege ---------------------------------------------

RAY_IMAGE_USER, RAY_IMAGE_GROUP = 1000, 100
"""The Ray image's user (``ray``, uid 1000, group ``users``): its raylet's, and every Ray task's."""
SIDECAR_USER = SIDECAR_GROUP = 10001
"""The sidecar's own user and group: not the Ray image's, nor a group its user is in."""
DROPPED_EVERYTHING = {
    "runAsNonRoot": True,
    "runAsUser": SIDECAR_USER,
    "runAsGroup": SIDECAR_GROUP,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_specs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [manifest["spec"]["headGroupSpec"], *manifest["spec"]["workerGroupSpecs"]]
    return [g["template"]["spec"] for g in groups]


def test_every_sidecar_drops_every_privilege(manifest: dict[str, Any]) -> None:
    """runAsNonRoot (as the Ray image's own user, named by number: a name cannot be checked
    against runAsNonRoot), no privilege escalation, a read-only root file system, no
    capability, the runtime's default seccomp profile."""
    for container in sidecars(manifest):
        assert container["securityContext"] == DROPPED_EVERYTHING


def volume(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(v for v in spec["volumes"] if v["name"] == name)
    return found


def mount_of(container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume mount ``path`` lies under."""
    found: dict[str, Any] = next(
        m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")
    )
    return found


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's plain variables (not those the downward API fills)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def test_the_sidecar_cache_is_a_private_directory_in_a_memory_volume(manifest: dict[str, Any]) -> None:
    """RAYSCOPE_CACHE (where the single file unpacks its native libraries, the root file
    system being read-only) is a directory below an emptyDir of medium Memory: a tmpfs,
    root's and sticky (1777), under which the launcher makes its own 0700 directory. A
    disk emptyDir is 0777 and not sticky: the launcher refuses any cache there."""
    for spec, container in zip(pod_specs(manifest), sidecars(manifest)):
        cache = env_of(container)["RAYSCOPE_CACHE"]
        mount = mount_of(container, cache)
        assert not mount.get("readOnly")
        assert volume(spec, mount["name"])["emptyDir"]["medium"] == "Memory"


def test_the_token_is_copied_to_the_sidecars_user_by_a_step_that_holds_only_chown(
    manifest: dict[str, Any],
) -> None:
    """A Secret's files are root's (mode 0400 here): the sidecar, uid 10001, could not read
    its token. An init container copies it, owned by the sidecar's user and group, mode
    0400, into a memory volume the sidecar mounts read-only at its --token-file; it runs as
    root with CAP_CHOWN alone, no escalation, a read-only root file system."""
    for spec, container in zip(pod_specs(manifest), sidecars(manifest)):
        (init,) = spec["initContainers"]
        assert init["securityContext"] == {
            "runAsUser": 0,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        shell, flag, script, source, target = init["command"]
        assert (shell, flag) == ("sh", "-c")
        assert script == f'umask 0377 && cp "$0" "$1" && chown {SIDECAR_USER}:{SIDECAR_GROUP} "$1"'
        assert "secret" in volume(spec, mount_of(init, source)["name"])
        token_file = container["args"][container["args"].index("--token-file") + 1]
        assert target == token_file
        assert mount_of(init, target)["name"] == mount_of(container, token_file)["name"]
        assert mount_of(container, token_file)["readOnly"] is True
        assert volume(spec, mount_of(container, token_file)["name"])["emptyDir"]["medium"] == "Memory"


class Pod:
    """The worker group's pod, emulated on this host as its containers' securityContext
    asks (bwrap: the root file system read-only, a /dev of the standard nodes, the volumes
    bound; setpriv: the user,
    the capability bounding set, no new privileges; the seccomp profile is the runtime's
    and not emulated). Each volume is a directory here, root's, with the mode kubelet gives
    it: 1777 for a memory emptyDir (a tmpfs), 0777 for a disk one, 0400 files for a Secret
    (defaultMode 256)."""

    def __init__(self, spec: dict[str, Any], pyz: Path) -> None:
        self.spec = spec
        self.root = Path(tempfile.mkdtemp(prefix="rs-pod-", dir="/tmp"))
        try:
            self._lay_out(pyz)
        except BaseException:
            self.close()
            raise

    def _lay_out(self, pyz: Path) -> None:
        self.root.chmod(0o755)
        self.pyz = self.root / "rayscope.pyz"
        shutil.copyfile(pyz, self.pyz)
        self.pyz.chmod(0o644)
        self.paths: dict[str, Path] = {}
        for item in self.spec["volumes"]:
            path = self.root / item["name"]
            path.mkdir()
            if "secret" in item:
                (path / "token").write_text("0123456789abcdef0123456789abcdef\n")
                (path / "token").chmod(item["secret"]["defaultMode"])
                path.chmod(0o755)
            else:
                path.chmod(0o1777 if item["emptyDir"].get("medium") == "Memory" else 0o777)
            self.paths[item["name"]] = path

    def here(self, container: dict[str, Any], path: str) -> str:
        """A path of the container, as this host holds it (its volume's directory)."""
        mount = mount_of(container, path)
        return str(self.paths[mount["name"]]) + path[len(mount["mountPath"]) :]

    def run(
        self, container: dict[str, Any], command: list[str], env: dict[str, str]
    ) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            self.argv(container, command), env=env, capture_output=True, text=True, timeout=120, check=False
        )

    def start(
        self, container: dict[str, Any], command: list[str], env: dict[str, str]
    ) -> "subprocess.Popen[str]":
        """``command`` left running in ``container`` (its first line of output read by the caller)."""
        return subprocess.Popen(self.argv(container, command), env=env, stdout=subprocess.PIPE, text=True)

    def argv(self, container: dict[str, Any], command: list[str]) -> list[str]:
        context = container["securityContext"]
        assert set(context) <= set(DROPPED_EVERYTHING), set(context)
        argv = ["bwrap", "--die-with-parent"]
        argv += ["--ro-bind", "/", "/"] if context["readOnlyRootFilesystem"] else ["--bind", "/", "/"]
        argv += ["--dev", "/dev"]  # a container's /dev: the standard nodes (/dev/null) only
        for mount in container["volumeMounts"]:
            path = str(self.paths[mount["name"]])
            argv += ["--ro-bind" if mount.get("readOnly") else "--bind", path, path]
        capabilities = context["capabilities"]
        assert capabilities["drop"] == ["ALL"]
        bounding = ",".join(["-all", *(f"+{c.lower()}" for c in capabilities.get("add", []))])
        uid, gid = context["runAsUser"], context.get("runAsGroup", context["runAsUser"])
        argv += ["--", "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        argv += [f"--bounding-set={bounding}", "--inh-caps=-all", "--ambient-caps=-all"]
        argv += ["--no-new-privs"] if context["allowPrivilegeEscalation"] is False else []
        return [*argv, "--", *command]

    def copy_token(self) -> "subprocess.CompletedProcess[str]":
        (init,) = self.spec["initContainers"]
        mounted = tuple(m["mountPath"] + "/" for m in init["volumeMounts"])
        command = [self.here(init, w) if w.startswith(mounted) else w for w in init["command"]]
        return self.run(init, command, {"PATH": "/usr/bin:/bin"})

    def sidecar_status(self) -> "subprocess.CompletedProcess[str]":
        """The worker's sidecar, reading its token and unpacking into its cache: `status
        --head` at a closed port, so it gets as far as connecting."""
        container = next(c for c in self.spec["containers"] if c["name"] == "rayscope")
        token = self.here(container, container["args"][container["args"].index("--token-file") + 1])
        env = {
            "PATH": "/usr/bin:/bin",
            "RAYSCOPE_CACHE": self.here(container, env_of(container)["RAYSCOPE_CACHE"]),
        }
        command = [
            "/usr/bin/python3",
            str(self.pyz),
            "status",
            "--head",
            f"http://127.0.0.1:{refused_port()}",
        ]
        return self.run(container, [*command, "--token-file", token], env)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def pod_of(manifest: dict[str, Any], pyz: Path) -> Iterator[Callable[..., Pod]]:
    why_not = unit_sandbox.missing()
    if why_not:
        pytest.fail(f"the pod's emulation: {why_not}")
    made: list[Pod] = []

    def make(spec: Optional[dict[str, Any]] = None) -> Pod:
        made.append(Pod(spec or pod_specs(manifest)[1], pyz))  # the worker group's
        return made[-1]

    try:
        yield make
    finally:
        for pod in made:
            pod.close()


def test_the_sidecar_runs_the_single_file_with_every_privilege_dropped(
    manifest: dict[str, Any], pod_of: Callable[..., Pod]
) -> None:
    """The worker group's pod as the manifest writes it: the token step gives the token to
    uid 10001, mode 0400; the sidecar, uid 10001 with nothing else, reads it and unpacks the
    single file in its memory volume (it then finds the head closed, the test's doing).
    Controls: without the token step the sidecar cannot read root's 0400 token; with the
    cache on a disk emptyDir (0777, not sticky) the launcher refuses it."""
    pod = pod_of()
    copied = pod.copy_token()
    assert copied.returncode == 0, copied.stderr
    token = pod.paths["rayscope-token"] / "token"
    st = token.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (SIDECAR_USER, SIDECAR_GROUP, 0o400)
    done = pod.sidecar_status()
    assert (done.returncode, done.stderr.split(" at ")[0]) == (2, "rayscope: head agent unreachable"), (
        done.stderr
    )
    unpacked = [p for p in pod.paths["rayscope-cache"].rglob("site-packages") if p.is_dir()]
    assert unpacked and all(p.stat().st_uid == SIDECAR_USER for p in unpacked)

    without_copy = pod_of()  # the Secret's file itself, as the sidecar mounted it before
    shutil.copy2(
        without_copy.paths["rayscope-secret"] / "token", without_copy.paths["rayscope-token"] / "token"
    )
    done = without_copy.sidecar_status()
    assert "cannot read token file" in done.stderr and "Permission denied" in done.stderr

    spec = copy.deepcopy(pod_specs(manifest)[1])
    del volume(spec, "rayscope-cache")["emptyDir"]["medium"]
    on_disk = pod_of(spec)
    assert on_disk.copy_token().returncode == 0
    done = on_disk.sidecar_status()
    assert done.returncode != 0 and "writable by group or others" in done.stderr, done.stderr


# -- the head sidecar's memory limit, from the head's measured memory at its caps -----------


def quantity_mib(text: str) -> float:
    """A Kubernetes memory quantity (``256Mi``, ``2Gi``, ``1G``, bytes) in MiB."""
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "K": 1e3 / 2**20, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    number = re.fullmatch(r"(\d+)([KMG]i?)?", text)
    assert number is not None, text
    return int(number.group(1)) * (units[number.group(2)] if number.group(2) else 1 / 2**20)


def test_the_head_sidecars_memory_limit_holds_the_measured_peak_at_the_cap(manifest: dict[str, Any]) -> None:
    """The limit is at least the head's peak RSS SECURITY.md states for its 256 unknown nodes
    of the largest report, plus the memory volume (a tmpfs counts against the limit). Before:
    256Mi, below even the 512 MiB the unknown nodes' reports alone may hold."""
    security = (REPO / "SECURITY.md").read_text()
    stated = re.search(r"at most ([\d,]+) to ([\d,]+) MiB \(peak\s+RSS", security)
    assert stated is not None
    peak_mib = int(stated.group(2).replace(",", ""))
    head, *_ = sidecars(manifest)
    spec = pod_specs(manifest)[0]
    tmpfs_mib = sum(
        quantity_mib(str(v["emptyDir"]["sizeLimit"]))
        for v in spec["volumes"]
        if v.get("emptyDir", {}).get("medium") == "Memory"
        and any(m["name"] == v["name"] for m in head["volumeMounts"])
    )
    assert quantity_mib(head["resources"]["limits"]["memory"]) >= peak_mib + tmpfs_mib


# -- the token is the sidecar's alone: a user of its own, no shared process namespace -----


def ray_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in spec["containers"] if c["name"] != "rayscope"]


def test_no_ray_container_can_reach_the_sidecars_token(manifest: dict[str, Any]) -> None:
    """Before: the sidecar ran as the Ray image's user in the Ray container's process
    namespace, so any Ray task could read its token at /proc/PID/root/etc/rayscope/token.
    Now, in every group: no shared process namespace (the Ray image's user has sudo, so a
    Ray task can be root in its container and take any uid: only not seeing the sidecar's
    processes keeps their /proc entries out of its reach, which the emulation below shows);
    the sidecar's user and group are its own; the Ray container mounts neither the Secret nor
    the token's volume; the token step gives the file to the sidecar's user and group alone.
    The pod template has no securityContext (the schema walk refuses one), so no fsGroup adds
    a group to the Ray container's processes."""
    for spec, sidecar in zip(pod_specs(manifest), sidecars(manifest)):
        assert not spec.get("shareProcessNamespace")
        context = sidecar["securityContext"]
        assert context["runAsUser"] not in (0, RAY_IMAGE_USER)
        assert context["runAsGroup"] not in (0, RAY_IMAGE_GROUP)
        (init,) = spec["initContainers"]
        token_volumes = {m["name"] for m in init["volumeMounts"]}
        assert token_volumes == {"rayscope-secret", "rayscope-token"}
        for ray in ray_containers(spec):
            assert not token_volumes & {m["name"] for m in ray.get("volumeMounts", [])}, ray["name"]
            assert ray.get("securityContext", {}).get("runAsUser", RAY_IMAGE_USER) == RAY_IMAGE_USER


def as_ray_user(command: list[str]) -> "subprocess.CompletedProcess[str]":
    """``command`` as a Ray task runs: the Ray image's user and group, no other group, no
    capability (a non-root process in the Ray container)."""
    setpriv = ["setpriv", f"--reuid={RAY_IMAGE_USER}", f"--regid={RAY_IMAGE_GROUP}", "--clear-groups"]
    return subprocess.run(
        [*setpriv, "--inh-caps=-all", "--", *command], capture_output=True, text=True, timeout=30, check=False
    )


def holding_its_token(pod: Pod, spec: dict[str, Any]) -> tuple["subprocess.Popen[str]", int, str]:
    """The sidecar of ``spec`` running (as its securityContext says) with its token open: the
    process, its pid, and its token's path as its own mount namespace holds it."""
    sidecar = next(c for c in spec["containers"] if c["name"] == "rayscope")
    token = pod.here(sidecar, sidecar["args"][sidecar["args"].index("--token-file") + 1])
    script = f"import os, time; open({token!r}).read(); print(os.getpid(), flush=True); time.sleep(60)"
    process = pod.start(sidecar, ["/usr/bin/python3", "-c", script], {"PATH": "/usr/bin:/bin"})
    assert process.stdout is not None
    return process, int(process.stdout.readline()), token


def stop(process: "subprocess.Popen[str]") -> None:
    process.kill()
    process.wait(30)
    if process.stdout is not None:
        process.stdout.close()


def test_the_ray_containers_user_cannot_read_the_token_nor_the_sidecars_proc_entries(
    manifest: dict[str, Any], pod_of: Callable[..., Pod]
) -> None:
    """The worker's pod as the manifest writes it, the token copied: a process of the Ray
    image's user opens neither the token (uid 10001's, mode 0400, group 10001) nor the
    sidecar's /proc/PID/root or /proc/PID/environ (another uid: the kernel's ptrace check).
    Controls, the holes the manifest closes: a sidecar of the Ray image's user (the manifest
    before) gives the Ray user its token through /proc/PID/root; and one of its own user is
    read that way by root holding only CAP_SETUID and CAP_SETGID (a Ray task through the Ray
    image's sudo, had the pod shared its process namespace)."""
    spec = pod_specs(manifest)[1]
    pod = pod_of(spec)
    assert pod.copy_token().returncode == 0
    process, pid, token = holding_its_token(pod, spec)
    try:
        for path in (token, f"/proc/{pid}/root{token}", f"/proc/{pid}/environ"):
            done = as_ray_user(["cat", path])
            assert done.returncode != 0 and "Permission denied" in done.stderr, (path, done)
        setuid = ["setpriv", f"--reuid={SIDECAR_USER}", f"--regid={SIDECAR_GROUP}", "--clear-groups"]
        sudo = subprocess.run(
            [*setuid, "--bounding-set=-all,+setuid,+setgid", "--", "cat", f"/proc/{pid}/root{token}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (sudo.returncode, sudo.stdout) == (0, "0123456789abcdef0123456789abcdef\n"), sudo.stderr
    finally:
        stop(process)

    before = copy.deepcopy(spec)  # the sidecar as the Ray image's user, as the manifest had it
    sidecar = next(c for c in before["containers"] if c["name"] == "rayscope")
    sidecar["securityContext"].update(runAsUser=RAY_IMAGE_USER, runAsGroup=RAY_IMAGE_GROUP)
    (init,) = before["initContainers"]
    init["command"][2] = init["command"][2].replace(
        f"{SIDECAR_USER}:{SIDECAR_GROUP}", f"{RAY_IMAGE_USER}:{RAY_IMAGE_GROUP}"
    )
    old = pod_of(before)
    assert old.copy_token().returncode == 0
    process, pid, token = holding_its_token(old, before)
    try:
        done = as_ray_user(["cat", f"/proc/{pid}/root{token}"])
        assert (done.returncode, done.stdout) == (0, "0123456789abcdef0123456789abcdef\n"), done.stderr
    finally:
        stop(process)


STUB_PYTHON = """#!/bin/sh
# python for the node-id script: `status` answers the GCS's view from a file, `push` says
# what it was given; the rest (the script's `python -c`) is the real one.
case "$2" in
  status) cat "$STUB_STATUS"; exit 1 ;;
  push) shift; echo "$*"; exit 0 ;;
esac
exec /usr/bin/python3 "$@"
"""


def test_the_worker_sidecar_reports_for_the_alive_ray_node_at_its_pod_ip(
    manifest: dict[str, Any], pod_of: Callable[..., Pod]
) -> None:
    """Without the raylet in sight, the worker's sidecar takes its node id from the GCS: the
    one alive node at the pod's IP (a dead one of an earlier raylet there, and another pod's,
    are not it), then runs its push with --node-id. The liveness check passes while that node
    lives or the GCS cannot be read, and fails once another alive node has the pod's IP (the
    Ray container restarted in place), so the sidecar restarts to report for that one. Run in
    the pod's emulation, ``python`` a stub that answers ``status`` from a file."""
    spec = pod_specs(manifest)[1]
    sidecar = next(c for c in spec["containers"] if c["name"] == "rayscope")
    shell, flag, script, pyz = sidecar["command"]
    assert sidecar["livenessProbe"]["exec"]["command"] == [shell, flag, script, pyz, "--check"]
    env_names = {e["name"]: e for e in sidecar["env"]}
    assert env_names["RAYSCOPE_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env_of(sidecar)["RAYSCOPE_GCS"] == f"{manifest['metadata']['name']}-head-svc:6379"
    pod = pod_of(spec)
    stub = pod.root / "bin"
    stub.mkdir(mode=0o755)
    (stub / "python").write_text(STUB_PYTHON)
    (stub / "python").chmod(0o755)
    status = pod.root / "status.json"

    def gcs_says(*nodes: tuple[str, str, bool]) -> None:
        document = {
            "nodes": {n: {"node_ip": ip, "alive": alive, "in_scheduler": True} for n, ip, alive in nodes}
        }
        status.write_text(json.dumps(document))
        status.chmod(0o644)

    env = {
        "PATH": f"{stub}:/usr/bin:/bin",
        "RAYSCOPE_CACHE": pod.here(sidecar, env_of(sidecar)["RAYSCOPE_CACHE"]),
        "RAYSCOPE_POD_IP": "10.1.2.3",
        "STUB_STATUS": str(status),
    }
    mine, earlier, other = "a" * 56, "b" * 56, "c" * 56
    gcs_says((earlier, "10.1.2.3", False), (other, "10.1.2.4", True), (mine, "10.1.2.3", True))
    done = pod.run(sidecar, [shell, flag, script, str(pod.pyz), *sidecar["args"]], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == " ".join([*sidecar["args"], "--node-id", mine]) + "\n"

    def check() -> int:
        return pod.run(sidecar, [shell, flag, script, str(pod.pyz), "--check"], env).returncode

    assert check() == 0
    status.write_text("")  # the GCS not read: no restart for that
    assert check() == 0
    gcs_says((mine, "10.1.2.3", False), ("d" * 56, "10.1.2.3", True))
    assert check() != 0
