"""A test agent that plays the kubelet, the Job and Deployment controllers, kube-proxy and the
garbage collector for this project's own pods, against the kmock emulator.

The emulator stores objects but runs nothing. This agent polls it and, for every Job and
Deployment, runs the pod's containers as local processes: the container command (``packrat``
mapped to this interpreter), its env and args, emptyDir and ConfigMap volumes as temporary
directories (a PersistentVolumeClaim as one directory per claim, shared by every pod; mount
paths rewritten in args and env), port 8080 remapped to a free local port and ``0.0.0.0``
to loopback. It writes Job and Deployment status from what those processes do
(exit codes, HTTP readiness probes), creates Pod objects for Job pods with container statuses
and ``FallbackToLogsOnError`` messages, serves container logs through the emulator, forwards
Service traffic to the ready pods its selector matches, and deletes objects whose owners are
gone (PackratModels owned by a deleted PackratPipeline included). It plays the cluster DNS
too: a Service URL of this namespace in a ConfigMap a pod mounts
(``http://NAME.NAMESPACE.svc:8080``, as in a pipeline router's config) is written out as
the kube-proxy's address for that Service, so the pod reaches it as it would in a cluster.
It only knows the images in ``images``; any other image is an image pull error.

Fault injection, for failure scenarios: ``oom_kill_job_pods`` kills that many Job pods' first
container with SIGKILL shortly after it starts and reports ``OOMKilled``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator import Api, CompatEmulator

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


NODE_MEMORY = 64 * 2**30
_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def _bytes(quantity: str) -> float:
    for unit, factor in _UNITS.items():
        if quantity.endswith(unit):
            return float(quantity[: -len(unit)]) * factor
    return float(quantity)


def qos_class(pod_spec: Mapping[str, Any]) -> str:
    """The pod's QoS class, by the kubelet's rules (init containers included)."""
    containers = [*(pod_spec.get("initContainers") or []), *pod_spec["containers"]]
    guaranteed = True
    any_request = False
    for c in containers:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        any_request = any_request or bool(requests or limits)
        for kind in ("cpu", "memory"):
            if kind not in limits or requests.get(kind, limits[kind]) != limits[kind]:
                guaranteed = False
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if any_request else "BestEffort"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-2048:]


@dataclass
class LocalPod:
    name: str
    owner_kind: str
    owner_name: str
    # like the real controllers, match pods by their owner's uid: a Job or Deployment
    # recreated under the same name must not adopt the pods of its deleted predecessor
    # (the garbage collector deletes those, so a deleted Deployment's pods stop serving)
    owner_uid: str
    template_hash: str
    labels: dict[str, str]
    spec: dict[str, Any]
    workdir: Path
    port: int = 0
    phase: str = "Pending"  # Pending, Running, Succeeded, Failed
    ready: bool = False
    terminating: bool = False
    waiting_reason: str = ""
    unschedulable_since: str = ""  # when the scheduler gave up on it (PodScheduled=False)
    ready_since: str = ""  # when its Ready condition last turned True (lastTransitionTime)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    init_names: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    started: float = field(default_factory=time.monotonic)
    probe_failures: int = 0
    stopped: threading.Event = field(default_factory=threading.Event)


class Agent:
    def __init__(
        self,
        *,
        api: Api,
        emulator: CompatEmulator,
        workdir: Path,
        images: set[str],
        period: float = 0.25,
    ) -> None:
        self.api = api
        self.emulator = emulator
        self.workdir = workdir
        self.images = images
        self.period = period
        self.pods: dict[str, LocalPod] = {}
        self.oom_kill_job_pods = 0
        self.errors: list[str] = []
        self.terminations: list[tuple[float, str, int]] = []
        self.qos: dict[str, str] = {}  # every pod ever started -> its QoS class
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agent", daemon=True)
        self._counter = itertools.count(1)
        self._job_failures: dict[str, int] = {}
        self._job_started: dict[str, float] = {}
        self.proxy = ServiceProxy(self)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Agent:
        self.proxy.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            pods = list(self.pods.values())
        for pod in pods:
            self._kill(pod, grace=5)
        self.proxy.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # keep playing the cluster; tests read .errors
                self.errors.append(repr(exc))
            self._stop.wait(self.period)

    def step(self) -> None:
        self._collect_garbage()
        for job in self.api.list("jobs"):
            self._job(job)
        for dep in self.api.list("deployments"):
            self._deployment(dep)
        self._refresh_config_volumes()
        self._probe()
        self._update_endpoints()
        self._publish_serving_pods()

    # -- garbage collector ------------------------------------------------------------------------
    def _collect_garbage(self) -> None:
        uids = set()
        owners = ("packratpipelines", "packratpools", "packratmodels", "jobs", "deployments")
        for resource in owners:
            uids |= {o["metadata"].get("uid") for o in self.api.list(resource)}
        for resource in ("packratmodels", "configmaps", "services", "deployments", "jobs", "pods"):
            for obj in self.api.list(resource):
                refs = obj["metadata"].get("ownerReferences") or []
                if obj["metadata"].get("deletionTimestamp"):
                    continue  # deleted already, waiting for its finalizers
                if refs and not any(r.get("uid") in uids for r in refs):
                    self.api.delete(resource, obj["metadata"]["name"])
        live_jobs = {j["metadata"].get("uid") for j in self.api.list("jobs")}
        live_deps = {d["metadata"].get("uid") for d in self.api.list("deployments")}
        with self._lock:
            pods = list(self.pods.values())
        for pod in pods:
            alive = (
                pod.owner_uid in live_jobs
                if pod.owner_kind == "Job"
                else pod.owner_uid in live_deps
            )
            if not alive:
                self._terminate(pod)

    # -- running containers -------------------------------------------------------------------
    def _mounts(self, pod: LocalPod) -> dict[str, Path]:
        """Volume name -> local directory (emptyDir fresh, ConfigMap files written)."""
        out: dict[str, Path] = {}
        for volume in pod.spec.get("volumes") or []:
            path = pod.workdir / "v" / volume["name"]
            if "persistentVolumeClaim" in volume:  # one directory per claim, shared by pods
                path = self.workdir / "claims" / volume["persistentVolumeClaim"]["claimName"]
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                cm = self.api.get("configmaps", volume["configMap"]["name"]) or {}
                for key, value in (cm.get("data") or {}).items():
                    (path / key).write_text(self._resolve_services(value))
            if "secret" in volume:
                secret = self.api.get("secrets", volume["secret"]["secretName"]) or {}
                for key, value in (secret.get("data") or {}).items():
                    (path / key).write_bytes(base64.b64decode(value))
            out[volume["name"]] = path
        return out

    def _refresh_config_volumes(self) -> None:
        """The kubelet's sync of mounted ConfigMaps: a running pod's ConfigMap volume gets
        the object's new data (each file swapped in whole, never half written). Played for
        pool pods only, the one kind that reads its mounted config after it starts (the
        other tests' pods keep what they started with, as they always had here)."""
        with self._lock:
            pods = [
                p
                for p in self.pods.values()
                if p.phase == "Running"
                and not p.terminating
                and p.labels.get("app.kubernetes.io/name") == "packrat-pool"
            ]
        for pod in pods:
            for volume in pod.spec.get("volumes") or []:
                if "configMap" not in volume:
                    continue
                cm = self.api.get("configmaps", volume["configMap"]["name"]) or {}
                path = pod.workdir / "v" / volume["name"]
                for key, value in (cm.get("data") or {}).items():
                    text, target = self._resolve_services(value), path / key
                    with contextlib.suppress(OSError):  # the pod's folder may be gone
                        if target.read_text() != text:
                            (path / f".{key}.new").write_text(text)
                            os.replace(path / f".{key}.new", target)

    def _resolve_services(self, text: str) -> str:
        """Cluster DNS: ``http://NAME.NAMESPACE.svc:8080`` of this namespace -> the proxy."""
        pattern = rf"http://([a-z0-9-]+)\.{re.escape(self.api.namespace)}\.svc:8080"
        return re.sub(pattern, lambda m: self.proxy.url(m.group(1)), text)

    def _command(
        self, pod: LocalPod, container: Mapping[str, Any], volumes: Mapping[str, Path]
    ) -> tuple[list[str], dict[str, str]]:
        mapping = {
            m["mountPath"]: str(volumes[m["name"]]) for m in container.get("volumeMounts") or []
        }

        def local(value: str) -> str:
            for mount, path in sorted(mapping.items(), key=lambda kv: -len(kv[0])):
                if value == mount or value.startswith(mount + "/"):
                    return path + value[len(mount) :]
            return value

        argv = [
            local(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]
        ]
        if argv and argv[0] == "packrat":
            argv = [sys.executable, "-m", "packrat", *argv[1:]]
        elif argv and argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        for i, arg in enumerate(argv[:-1]):
            if arg == "--port" and argv[i + 1] == "8080":
                pod.port = pod.port or free_port()
                argv[i + 1] = str(pod.port)
            if arg == "--grpc-port" and argv[i + 1] == "8081":  # pods share this host's ports
                argv[i + 1] = str(free_port())
            if arg == "--host" and argv[i + 1] == "0.0.0.0":
                argv[i + 1] = "127.0.0.1"
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        for item in container.get("env") or []:
            env[item["name"]] = local(self._env_value(item))
        return argv, env

    def _env_value(self, item: Mapping[str, Any]) -> str:
        """An env entry's value as the kubelet resolves it when the container starts: a
        literal, or a ConfigMap's or a Secret's key (read now: a container started later
        reads what the object holds then)."""
        source = item.get("valueFrom") or {}
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            cm = self.api.get("configmaps", ref["name"]) or {}
            value = (cm.get("data") or {}).get(ref["key"])
            if value is None:
                raise RuntimeError(f"CreateContainerConfigError: configmap {ref['name']}")
            return str(value)
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = self.api.get("secrets", ref["name"]) or {}
            raw = (secret.get("data") or {}).get(ref["key"])
            if raw is None:
                raise RuntimeError(f"CreateContainerConfigError: secret {ref['name']}")
            return base64.b64decode(raw).decode()
        return str(item.get("value", ""))

    def _start(self, pod: LocalPod) -> None:
        threading.Thread(
            target=self._run_pod, args=(pod,), name=f"pod-{pod.name}", daemon=True
        ).start()

    def _run_pod(self, pod: LocalPod) -> None:
        containers = [*(pod.spec.get("initContainers") or []), *pod.spec["containers"]]
        pod.init_names = [c["name"] for c in pod.spec.get("initContainers") or []]
        too_big = [
            c for c in containers if _bytes(c["resources"]["requests"]["memory"]) > NODE_MEMORY
        ]
        if too_big:  # the scheduler finds no node with that much memory
            pod.waiting_reason = "Unschedulable"
            pod.unschedulable_since = _now()
            return
        if any(c["image"] not in self.images for c in containers):
            bad = next(c for c in containers if c["image"] not in self.images)
            pod.waiting_reason = "ErrImagePull"
            pod.statuses[bad["name"]] = {
                "waiting": {"reason": "ErrImagePull", "message": f"pull {bad['image']}: not found"}
            }
            return  # stays Pending, never ready
        volumes = self._mounts(pod)
        pod.phase = "Running"
        for index, container in enumerate(containers):
            if pod.terminating:
                return
            try:
                argv, env = self._command(pod, container, volumes)
            except RuntimeError as exc:  # a missing ConfigMap or Secret key
                pod.phase = "Pending"
                pod.waiting_reason = "CreateContainerConfigError"
                pod.statuses[container["name"]] = {
                    "waiting": {"reason": pod.waiting_reason, "message": str(exc)}
                }
                return
            log = pod.workdir / f"{container['name']}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=pod.workdir,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            pod.proc = proc
            pod.statuses[container["name"]] = {"running": {"startedAt": _now()}}
            oom = False
            if pod.owner_kind == "Job" and index == 0:
                with self._lock:
                    if self.oom_kill_job_pods > 0:
                        self.oom_kill_job_pods -= 1
                        oom = True
            if oom:
                time.sleep(1.0)
                os.killpg(proc.pid, signal.SIGKILL)
            key = (self.api.namespace, pod.name, container["name"])
            while True:  # the log is readable while the container runs (kubectl logs -f)
                try:
                    code = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    self.emulator.pod_logs[key] = log.read_text(errors="replace")
            if pod.terminating:
                return
            reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
            message = _tail(log) if code != 0 else ""
            pod.statuses[container["name"]] = {
                "terminated": {
                    "exitCode": 137 if oom else code,
                    "reason": reason,
                    "message": message,
                    "finishedAt": _now(),
                }
            }
            with contextlib.suppress(OSError):  # the pod's folder may be gone (teardown)
                self.emulator.pod_logs[key] = log.read_text(errors="replace")
            if code != 0 or oom:
                pod.phase = "Failed"
                return
        pod.phase = "Succeeded"

    def _kill(self, pod: LocalPod, *, grace: float) -> None:
        proc = pod.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        except ProcessLookupError:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # TorchServe children of a stopped pod

    def _terminate(self, pod: LocalPod) -> None:
        """Graceful pod deletion: out of the endpoints at once, SIGTERM, then gone."""
        with self._lock:
            if pod.terminating:
                return
            pod.terminating = True
            pod.ready = False
        grace = float(pod.spec.get("terminationGracePeriodSeconds", 30))
        self._update_endpoints()  # the endpoints controller drops it first
        pre_stop = (pod.spec["containers"][0].get("lifecycle") or {}).get("preStop") or {}
        delay = float((pre_stop.get("sleep") or {}).get("seconds", 0))
        self.terminations.append((time.monotonic(), pod.name, pod.port))

        def finish() -> None:
            if delay and pod.phase == "Running":
                time.sleep(delay)  # preStop sleep: traffic still in flight lands
            self._kill(pod, grace=grace)
            with self._lock:
                self.pods.pop(pod.name, None)
            shutil.rmtree(pod.workdir, ignore_errors=True)
            pod.stopped.set()

        threading.Thread(target=finish, name=f"stop-{pod.name}", daemon=True).start()

    def _new_pod(
        self,
        *,
        owner_kind: str,
        owner_name: str,
        template: Mapping[str, Any],
        template_hash: str,
        owner_uid: str = "",
    ) -> LocalPod:
        name = f"{owner_name}-{next(self._counter)}"
        self.qos[name] = qos_class(template["spec"])
        pod = LocalPod(
            name=name,
            owner_kind=owner_kind,
            owner_name=owner_name,
            owner_uid=owner_uid,
            template_hash=template_hash,
            labels=dict((template.get("metadata") or {}).get("labels") or {}),
            spec=json.loads(json.dumps(template["spec"])),
            # short paths: TorchServe puts Unix sockets under TMPDIR (108-byte limit)
            workdir=Path(tempfile.mkdtemp(prefix="p", dir=self.workdir)),
        )
        with self._lock:
            self.pods[name] = pod
        self._start(pod)
        return pod

    # -- Job controller ----------------------------------------------------------------------------
    def _pod_object(self, pod: LocalPod, job: Mapping[str, Any], *, phase: str) -> dict[str, Any]:
        def statuses(names: list[str]) -> list[dict[str, Any]]:
            return [
                {
                    "name": n,
                    "state": pod.statuses.get(n, {"waiting": {"reason": "PodInitializing"}}),
                }
                for n in names
            ]

        status: dict[str, Any] = {
            "phase": phase,
            "qosClass": self.qos.get(pod.name, ""),
            "initContainerStatuses": statuses(pod.init_names),
            "containerStatuses": statuses([c["name"] for c in pod.spec["containers"]]),
        }
        if pod.unschedulable_since:  # what the scheduler reports for a pod no node fits
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient memory.",
                    "lastTransitionTime": pod.unschedulable_since,
                }
            ]
        return status

    def _job(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        status = job.get("status") or {}
        if any(c.get("status") == "True" for c in status.get("conditions") or []):
            return
        with self._lock:
            uid = job["metadata"]["uid"]
            mine = [p for p in self.pods.values() if p.owner_kind == "Job" and p.owner_uid == uid]
        # one snapshot of the pods' phases: the Job's status never runs ahead of its pods'
        phases = {p.name: p.phase for p in mine}
        active = [p for p in mine if phases[p.name] in ("Pending", "Running") and not p.terminating]
        started = self._job_started.setdefault(job["metadata"]["uid"], time.monotonic())
        deadline = job["spec"].get("activeDeadlineSeconds")
        for pod in mine:  # publish pod objects (the operator reads reasons from them)
            body = self._pod_object(pod, job, phase=phases[pod.name])
            existing = self.api.get("pods", pod.name)
            if existing is None:
                self.api.create(
                    "pods",
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": pod.name,
                            "labels": {
                                **pod.labels,
                                "job-name": name,
                                "batch.kubernetes.io/job-name": name,
                            },
                            "ownerReferences": [
                                {
                                    "apiVersion": "batch/v1",
                                    "kind": "Job",
                                    "name": name,
                                    "uid": job["metadata"]["uid"],
                                    "controller": True,
                                }
                            ],
                        },
                        "spec": pod.spec,
                        "status": body,
                    },
                )
            elif existing.get("status") != body:
                self.api.patch("pods", pod.name, {"status": body}, sub="status")
        failed = sum(1 for p in mine if phases[p.name] == "Failed")
        succeeded = sum(1 for p in mine if phases[p.name] == "Succeeded")
        new_status: dict[str, Any] = {
            "startTime": status.get("startTime") or _now(),
            "active": len(active),
            "failed": failed,
            "succeeded": succeeded,
        }
        if succeeded:
            new_status["conditions"] = [
                {"type": "Complete", "status": "True", "lastTransitionTime": _now()}
            ]
            new_status["completionTime"] = _now()
        elif failed > int(job["spec"].get("backoffLimit", 6)):
            new_status["conditions"] = [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                }
            ]
        elif deadline is not None and time.monotonic() - started > float(deadline):
            for pod in active:
                self._terminate(pod)
            new_status["conditions"] = [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                }
            ]
        elif not active:
            template = job["spec"]["template"]
            self._new_pod(
                owner_kind="Job",
                owner_name=name,
                owner_uid=job["metadata"]["uid"],
                template=template,
                template_hash="",
            )
            new_status["active"] = 1
        if {k: status.get(k) for k in new_status} != new_status:
            self.api.patch("jobs", name, {"status": new_status}, sub="status")

    # -- Deployment controller -----------------------------------------------------------------
    def _deleting_deployment(self, dep: dict[str, Any]) -> None:
        """A Deployment being deleted. The Deployment controller only syncs its status (no
        rollout, no scaling). On a background delete its ReplicaSet stays until the Deployment
        is gone, and keeps its pods (one that fails is replaced from its own template), so
        they serve on while a finalizer holds the Deployment; on a foreground delete the
        garbage collector deletes the pods first, then removes ``foregroundDeletion``."""
        name = dep["metadata"]["name"]
        uid = str(dep["metadata"].get("uid", ""))
        finalizers = list(dep["metadata"].get("finalizers") or [])
        with self._lock:
            mine = [p for p in self.pods.values() if p.owner_uid == uid and not p.terminating]
        if "foregroundDeletion" in finalizers:
            for pod in mine:
                self._terminate(pod)
            with self._lock:
                left = [p for p in self.pods.values() if p.owner_uid == uid]
            if not left:
                rest = [f for f in finalizers if f != "foregroundDeletion"]
                self.api.patch("deployments", name, {"metadata": {"finalizers": rest}})
            return
        for pod in [p for p in mine if p.phase == "Failed"]:
            self._terminate(pod)
            self._new_pod(
                owner_kind="Deployment",
                owner_name=name,
                owner_uid=uid,
                template={"metadata": {"labels": pod.labels}, "spec": pod.spec},
                template_hash=pod.template_hash,
            )
        self._deployment_status(dep, updated=None)

    def _deployment_status(self, dep: dict[str, Any], *, updated: int | None) -> None:
        """Status as the Deployment controller writes it (terminating pods not counted)."""
        name = dep["metadata"]["name"]
        uid = str(dep["metadata"].get("uid", ""))
        with self._lock:
            alive = [
                p
                for p in self.pods.values()
                if p.owner_kind == "Deployment" and p.owner_uid == uid and not p.terminating
            ]
        status = dep.get("status") or {}
        new_status = {
            "observedGeneration": dep["metadata"].get("generation", 1),
            "replicas": len(alive),
            "updatedReplicas": status.get("updatedReplicas", 0) if updated is None else updated,
            "readyReplicas": len([p for p in alive if p.ready]),
            "availableReplicas": len([p for p in alive if p.ready]),
        }
        if {k: status.get(k) for k in new_status} != new_status:
            self.api.patch("deployments", name, {"status": new_status}, sub="status")

    def _deployment(self, dep: dict[str, Any]) -> None:
        if dep["metadata"].get("deletionTimestamp"):
            self._deleting_deployment(dep)
            return
        name = dep["metadata"]["name"]
        uid = str(dep["metadata"].get("uid", ""))
        replicas = int(dep["spec"].get("replicas", 1))
        template = dep["spec"]["template"]
        thash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:12]
        with self._lock:
            mine = [
                p
                for p in self.pods.values()
                if p.owner_kind == "Deployment"
                and p.owner_name == name
                and p.owner_uid == uid
                and not p.terminating
            ]
        for pod in [p for p in mine if p.phase == "Failed"]:  # restartPolicy Always
            log = pod.workdir / f"{pod.spec['containers'][0]['name']}.log"
            self.errors.append(f"pod {pod.name} exited: {_tail(log, 8)}")
            self._terminate(pod)
            mine.remove(pod)
        current = [p for p in mine if p.template_hash == thash]
        old = [p for p in mine if p.template_hash != thash]
        for _ in range(replicas - len(current)):
            current.append(
                self._new_pod(
                    owner_kind="Deployment",
                    owner_name=name,
                    owner_uid=uid,
                    template=template,
                    template_hash=thash,
                )
            )
        for pod in sorted(current, key=lambda p: -p.started)[: max(0, len(current) - replicas)]:
            self._terminate(pod)
            current.remove(pod)
        ready_current = [p for p in current if p.ready]
        if len(ready_current) >= replicas or replicas == 0:
            for pod in old:  # maxUnavailable 0: old pods go once the new ones serve
                self._terminate(pod)
        self._deployment_status(dep, updated=len([p for p in current if not p.terminating]))

    # -- kubelet probes and kube-proxy ---------------------------------------------------------
    def _probe(self) -> None:
        with self._lock:
            pods = [
                p for p in self.pods.values() if p.owner_kind == "Deployment" and not p.terminating
            ]
        for pod in pods:
            if pod.phase != "Running" or not pod.port:
                pod.ready = False
                continue
            if pod.proc is not None and pod.proc.poll() is not None:
                pod.ready = False
                pod.phase = "Failed"
                continue
            probe = pod.spec["containers"][0].get("readinessProbe") or {}
            timeout = float(probe.get("timeoutSeconds", 1))
            path = (probe.get("httpGet") or {}).get("path", "/ping")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{pod.port}{path}", timeout=timeout
                ) as resp:
                    ok = resp.status == 200
            except Exception:
                ok = False
            if ok:
                pod.probe_failures = 0
                if not pod.ready:
                    pod.ready_since = _now()
                pod.ready = True
            else:
                pod.probe_failures += 1
                if pod.probe_failures >= int(probe.get("failureThreshold", 3)):
                    pod.ready = False

    def _update_endpoints(self) -> None:
        endpoints: dict[str, list[int]] = {}
        for svc in self.api.list("services"):
            selector = svc["spec"].get("selector") or {}
            with self._lock:
                endpoints[svc["metadata"]["name"]] = [
                    p.port
                    for p in self.pods.values()
                    if p.ready
                    and not p.terminating
                    and all(p.labels.get(k) == v for k, v in selector.items())
                ]
        with self._lock:
            ports = {p.name: p.port for p in self.pods.values() if p.port}
        self.proxy.publish(services=endpoints, pods=ports)

    def _publish_serving_pods(self) -> None:
        """Pod objects for Deployment pods (podIP 127.0.0.1, Ready condition), so the operator
        can find each ready serving pod; ``/pod/{name}`` on the proxy reaches its port."""
        deps = {d["metadata"]["name"]: d for d in self.api.list("deployments")}
        with self._lock:
            pods = {
                p.name: p
                for p in self.pods.values()
                if p.owner_kind == "Deployment" and not p.terminating and p.owner_name in deps
            }
        existing = {
            o["metadata"]["name"]: o
            for o in self.api.list("pods")
            if any(
                r.get("kind") == "Deployment" for r in o["metadata"].get("ownerReferences") or []
            )
        }
        for name in existing:
            if name not in pods:
                self.api.delete("pods", name)
        for name, pod in pods.items():
            phase = "Running" if pod.phase == "Running" else "Pending"
            status = {
                "phase": phase,
                "podIP": "127.0.0.1" if phase == "Running" else "",
                "qosClass": self.qos.get(name, ""),
                "conditions": [{"type": "Ready", "status": "True" if pod.ready else "False"}],
            }
            if pod.ready and pod.ready_since:  # what the kubelet records; the tuner reads it
                status["conditions"][0]["lastTransitionTime"] = pod.ready_since
            if name not in existing:
                dep = deps[pod.owner_name]
                self.api.create(
                    "pods",
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": name,
                            "labels": dict(pod.labels),
                            "ownerReferences": [
                                {
                                    "apiVersion": "apps/v1",
                                    "kind": "Deployment",
                                    "name": pod.owner_name,
                                    "uid": dep["metadata"].get("uid"),
                                    "controller": True,
                                }
                            ],
                        },
                        "spec": pod.spec,
                        "status": status,
                    },
                )
            elif existing[name].get("status") != status:
                self.api.patch("pods", name, {"status": status}, sub="status")

    # -- queries for tests -------------------------------------------------------------------------
    def running(self, owner_name: str) -> list[LocalPod]:
        with self._lock:
            return [p for p in self.pods.values() if p.owner_name == owner_name]


class ServiceProxy:
    """kube-proxy for one port, run as its own process (``kubeproxy.py``): ``/svc/{service}/...``
    goes to a ready endpoint of that Service, ``/pod/{name}/...`` to that pod's port.

    The agent hands it the routing table through a file (:meth:`publish`, atomic rename, only
    when the table changed); the proxy rereads it on the next request.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.port = free_port()
        self.table = agent.workdir / "kube-proxy-table.json"
        self._published: str | None = None
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def publish(self, *, services: Mapping[str, list[int]], pods: Mapping[str, int]) -> None:
        text = json.dumps({"services": dict(services), "pods": dict(pods)}, sort_keys=True)
        with self._lock:
            if text == self._published:
                return
            tmp = self.table.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.table)
            self._published = text

    def start(self) -> None:
        self.publish(services={}, pods={})
        script = Path(__file__).resolve().parent / "kubeproxy.py"
        cmd = [sys.executable, str(script), "--port", str(self.port), "--table", str(self.table)]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # "ready" once it listens
        if line.strip() != "ready":
            self._proc.kill()
            raise RuntimeError(f"kube-proxy did not start (exit {self._proc.wait()})")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.port}/svc/{service}"

    def pod_url(self, pod: str) -> str:
        return f"http://127.0.0.1:{self.port}/pod/{pod}"
