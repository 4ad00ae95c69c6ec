"""End to end on a real cluster: kind with the kubelet's static CPU manager, both images built
and loaded, the Helm chart installed, the ResNet-50 example served, then reconfigured.

This is the only test that runs the operator against a real API server, kubelet and CPU
manager; everything else is checked offline. Opt-in (`make e2e-kind` sets
PACKRAT_E2E_KIND=1) and skipped with the reason where kind, Docker or helm are missing.

Environment: PACKRAT_E2E_CPUS (cpus per replica, default 1: a 4-vCPU runner has 3 allocatable
CPUs after the reserved one, and a switch runs both slots plus kind's control plane at once),
PACKRAT_E2E_KEEP=1 keeps the cluster afterwards, PACKRAT_E2E_SKIP_BUILD=1 reuses images
already in Docker.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KIND_CONFIG = Path(__file__).with_name("kind-config.yaml")
CHART = ROOT / "helm" / "packrat-operator"
EXAMPLE = ROOT / "examples" / "resnet50.yaml"
OPERATOR_NS = "packrat-system"
MODELS_NS = "packrat-e2e"
RELEASE = "packrat"
MODEL = "resnet50"
REPO = "ghcr.io/packrat-operator"
RESERVED_CPUS = {0}  # reservedSystemCPUs in kind-config.yaml


def _missing() -> str | None:
    if os.environ.get("PACKRAT_E2E_KIND") != "1":
        return "opt-in: run `make e2e-kind` (sets PACKRAT_E2E_KIND=1); it creates a kind cluster"
    absent = [tool for tool in ("kind", "docker", "helm", "kubectl") if shutil.which(tool) is None]
    if absent:
        return f"needs {', '.join(absent)} on PATH (not installed here)"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "needs a running Docker engine (`docker info` failed)"
    return None


pytestmark = [
    pytest.mark.e2e_kind,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]


def _version() -> str:
    import packrat

    return packrat.__version__


def sh(
    *cmd: str, env: dict[str, str] | None = None, check: bool = True, timeout: float = 900
) -> str:
    """Run a command, return stdout; on failure raise with its output."""
    result = subprocess.run(
        list(cmd),
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} -> {result.returncode}\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result.stdout


@dataclass
class Cluster:
    name: str
    kubeconfig: Path

    @property
    def node(self) -> str:
        return f"{self.name}-control-plane"

    def kubectl(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        return sh(
            "kubectl", "--kubeconfig", str(self.kubeconfig), *args, check=check, timeout=timeout
        )

    def helm(self, *args: str, timeout: float = 900) -> str:
        return sh("helm", "--kubeconfig", str(self.kubeconfig), *args, timeout=timeout)

    def get(self, *args: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return out


def wait_for(what: str, check: Callable[[], Any], *, timeout: float, every: float = 5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as exc:  # kubectl errors while objects appear
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    name = f"packrat-e2e-{os.getpid()}"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    sh(
        "kind", "create", "cluster", "--name", name, "--config", str(KIND_CONFIG),
        "--kubeconfig", str(kubeconfig), "--wait", "180s",
    )  # fmt: skip
    try:
        yield Cluster(name=name, kubeconfig=kubeconfig)
    finally:
        if os.environ.get("PACKRAT_E2E_KEEP") != "1":
            sh("kind", "delete", "cluster", "--name", name, check=False)


@pytest.fixture(scope="module")
def images(cluster: Cluster) -> dict[str, str]:
    version = _version()
    refs = {"operator": f"{REPO}/operator:{version}", "serving": f"{REPO}/serving:{version}"}
    if os.environ.get("PACKRAT_E2E_SKIP_BUILD") != "1":
        sh("make", "-C", str(ROOT), "images", f"IMAGE_REPO={REPO}", timeout=3600)
    for ref in refs.values():
        sh("kind", "load", "docker-image", ref, "--name", cluster.name, timeout=900)
    return refs


@pytest.fixture(scope="module")
def installed(cluster: Cluster, images: dict[str, str]) -> Iterator[None]:
    cluster.helm(
        "install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--create-namespace",
        "--set", "image.pullPolicy=Never", "--set", "resources.requests.cpu=50m",
        "--wait", "--timeout", "5m",
    )  # fmt: skip
    try:
        yield
    finally:
        cluster.kubectl("delete", "namespace", MODELS_NS, "--ignore-not-found", check=False)


def _model_manifest(cpus: int) -> dict[str, Any]:
    """The ResNet-50 example, sized to a CI runner: cpus per replica, a small profile grid."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = MODELS_NS
    spec = doc["spec"]
    spec.update(cpus=cpus, memory="3Gi", batchSize=2, replicas=1)
    spec["profiling"] = {
        "maxBatch": 4,
        "threads": list(range(1, cpus + 1)),
        "timeBudgetSeconds": 180,
        "timeoutSeconds": 1200,
        "backoffLimit": 1,
    }
    spec["switch"] = {"readyTimeoutSeconds": 600, "drainSeconds": 5}
    return doc


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def _free_millicores(cluster: Cluster) -> int:
    """The node's allocatable CPU minus what running pods request (what the scheduler sees)."""
    node = cluster.get("node", cluster.node)
    free = _millicores(node["status"]["allocatable"]["cpu"])
    pods = cluster.get(
        "pods", "-A", "--field-selector=status.phase!=Succeeded,status.phase!=Failed"
    )
    for pod in pods["items"]:
        for container in pod["spec"]["containers"]:
            free -= _millicores(container.get("resources", {}).get("requests", {}).get("cpu", "0"))
    return free


def _cpus_allowed(cluster: Cluster, pod: str) -> set[int]:
    status = cluster.kubectl("exec", "-n", MODELS_NS, pod, "--", "cat", "/proc/1/status")
    line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _serving_pods(cluster: Cluster, slot: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/name=packrat-serving,app.kubernetes.io/instance={MODEL}"
    pods = cluster.get("pods", "-n", MODELS_NS, "-l", f"{selector},packrat.dev/slot={slot}")
    items: list[dict[str, Any]] = pods["items"]
    return [p for p in items if p["metadata"].get("deletionTimestamp") is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _predict(cluster: Cluster, pod: str, *, count: int) -> list[int]:
    """POST `count` zero images to one serving pod through a port-forward; status codes."""
    port = _free_port()
    forward = subprocess.Popen(
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig), "port-forward", "-n", MODELS_NS,
         f"pod/{pod}", f"{port}:8080"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for("port-forward", lambda: _get(base + "/ping") == 200, timeout=60, every=1)
        body = bytes(3 * 224 * 224 * 4)  # one float32 3x224x224 sample, little-endian zeros
        codes = []
        for _ in range(count):
            request = urllib.request.Request(
                f"{base}/predictions/{MODEL}",
                data=body,
                headers={"Content-Type": "application/octet-stream"},
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                json.loads(response.read())
                codes.append(response.status)
        return codes
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status: int = response.status
            return status
    except (urllib.error.URLError, ConnectionError, OSError):
        return 0


class ModelFailed(Exception):
    """The PackratModel reached phase Failed: stop waiting, show why."""


def _prm(cluster: Cluster) -> dict[str, Any]:
    obj = cluster.get("packratmodel", MODEL, "-n", MODELS_NS)
    status = obj.get("status") or {}
    if status.get("phase") == "Failed":
        raise ModelFailed(json.dumps(status, indent=2)[-4000:])
    return obj


def _in_cluster_load(cluster: Cluster, image: str, *, seconds: int) -> str:
    """A Job in the models namespace sending Poisson load to the Service with `packrat loadgen`
    (through the Service, so a plan switch happens under traffic). Returns the Job name."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "loadgen", "namespace": MODELS_NS},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                    "containers": [
                        {
                            "name": "loadgen",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "args": [
                                "loadgen",
                                *("--url", f"http://{MODEL}.{MODELS_NS}.svc:8080"),
                                *("--model", MODEL, "--zoo", "resnet50"),
                                *("--rate", "2", "--duration", str(seconds), "--format", "json"),
                            ],
                            "resources": {
                                "requests": {"cpu": "50m", "memory": "1Gi"},
                                "limits": {"cpu": "500m", "memory": "1Gi"},
                            },
                            "env": [{"name": "HOME", "value": "/tmp"}],
                        }
                    ],
                }
            },
        },
    }
    path = cluster.kubeconfig.parent / "loadgen.json"
    path.write_text(json.dumps(job))
    cluster.kubectl("apply", "-f", str(path))
    return "loadgen"


def test_serve_reconfigure_uninstall(
    cluster: Cluster, images: dict[str, str], installed: None
) -> None:
    cpus = int(os.environ.get("PACKRAT_E2E_CPUS", "1"))

    # The node really runs the static CPU manager with CPU 0 reserved.
    state = json.loads(
        sh("docker", "exec", cluster.node, "cat", "/var/lib/kubelet/cpu_manager_state")
    )
    assert state["policyName"] == "static", state

    # The operator is up and `helm test` passes (its health endpoint answers).
    cluster.helm("test", RELEASE, "--namespace", OPERATOR_NS, "--timeout", "3m")

    # A plan switch runs both slots at once: make room for 2 x cpus exclusive CPUs. kind's
    # control plane requests ~0.95 CPU, so on a 4-vCPU runner (3 allocatable) one CoreDNS
    # replica must go.
    cluster.kubectl("scale", "deployment", "coredns", "-n", "kube-system", "--replicas=1")
    needed = 2 * cpus * 1000 + 50  # both slots + the loadgen Job
    free = wait_for(
        "CPU headroom for two slots",
        lambda: (f := _free_millicores(cluster)) >= needed and f,
        timeout=120,
    )
    assert free >= needed, f"node has {free}m CPU free, a switch needs {needed}m"

    # Apply the example and wait for Ready (profiling Job, plan, slot a).
    cluster.kubectl("create", "namespace", MODELS_NS)
    manifest = cluster.kubeconfig.parent / "resnet50.yaml"
    manifest.write_text(yaml.safe_dump(_model_manifest(cpus)))
    cluster.kubectl("apply", "-f", str(manifest))
    ready = wait_for(
        "PackratModel Ready",
        lambda: (p := _prm(cluster)).get("status", {}).get("phase") == "Ready" and p,
        timeout=1800,
        every=10,
    )
    status = ready["status"]
    first_slot = status["activeSlot"]
    assert status["batchSize"]["current"] == 2
    assert status["plan"]["batch"] == 2
    printed = cluster.kubectl("get", "prm", "-n", MODELS_NS)
    assert MODEL in printed and "Ready" in printed

    # Serving pods: Guaranteed QoS and an exclusive cpuset of exactly `cpus` cores.
    pods = _serving_pods(cluster, first_slot)
    assert len(pods) == 1
    pod = pods[0]
    assert pod["status"]["qosClass"] == "Guaranteed"
    allowed = _cpus_allowed(cluster, pod["metadata"]["name"])
    assert len(allowed) == cpus and not allowed & RESERVED_CPUS, allowed
    # The profile is stored for reuse (the operator deletes the finished Job itself).
    profile = cluster.get("configmap", status["profile"]["configMap"], "-n", MODELS_NS)
    points = json.loads(profile["data"]["profile.json"])["points"]
    assert len(points) >= 2 * cpus  # batches 1, 2, 4 x threads 1..cpus

    # Predictions work.
    assert _predict(cluster, pod["metadata"]["name"], count=5) == [200] * 5

    # Change the batch size under load: same cores, model and image, so the operator switches
    # inside the running pods of the active slot (no new pods; the Service does not move).
    _in_cluster_load(cluster, images["serving"], seconds=480)
    time.sleep(20)
    first_pod = pod["metadata"]["name"]
    cluster.kubectl(
        "patch", "prm", MODEL, "-n", MODELS_NS, "--type", "merge", "-p", '{"spec":{"batchSize":4}}'
    )
    switched = wait_for(
        "in-pod switch to batch 4",
        lambda: (
            (p := _prm(cluster))["status"].get("plan", {}).get("batch") == 4
            and p["status"].get("phase") == "Ready"
            and p
        ),
        # new instances start and warm beside the old ones in the same pod: minutes at most
        timeout=600,
        every=5,
    )
    last = switched["status"]["lastSwitch"]
    assert last["result"] == "Succeeded" and last["mode"] == "InPod", last
    assert switched["status"]["batchSize"]["current"] == 4
    assert switched["status"]["activeSlot"] == first_slot
    service = cluster.get("service", MODEL, "-n", MODELS_NS)
    assert service["spec"]["selector"]["packrat.dev/slot"] == first_slot
    same_pods = _serving_pods(cluster, first_slot)
    assert [p["metadata"]["name"] for p in same_pods] == [first_pod]  # no pod restarted
    assert _predict(cluster, first_pod, count=3) == [200] * 3

    # The load that ran through the switch saw no failed request.
    wait_for(
        "loadgen Job finished",
        lambda: (
            (s := cluster.get("job", "loadgen", "-n", MODELS_NS)["status"]).get("succeeded")
            or s.get("failed")
        ),
        timeout=600,
    )
    report = cluster.kubectl("logs", "-n", MODELS_NS, "job/loadgen")
    job = cluster.get("job", "loadgen", "-n", MODELS_NS)
    assert job["status"].get("succeeded") == 1, report  # loadgen exits 1 on any error

    # Deleting the model removes everything it created (owner references).
    cluster.kubectl("delete", "prm", MODEL, "-n", MODELS_NS, "--wait=true", timeout=300)
    wait_for(
        "children garbage-collected",
        lambda: not cluster.get(
            "deployments,services,jobs,configmaps", "-n", MODELS_NS, "-l",
            f"app.kubernetes.io/instance={MODEL}",
        )["items"],
        timeout=300,
    )  # fmt: skip

    # Uninstall: the operator and its RBAC are gone, the CRD stays (Helm keeps crds/).
    cluster.helm("uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait")
    left = cluster.get("deployments", "-n", OPERATOR_NS)["items"]
    assert left == []
    crd = cluster.kubectl("get", "crd", "packratmodels.packrat.dev", check=False)
    assert "packratmodels.packrat.dev" in crd
