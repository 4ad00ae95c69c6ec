"""The unit tests' shared fakes: an in-memory API server (``FakeKube``) that plays the
controllers' part (Jobs finishing, Deployments ready, the garbage collector), a profile, a model
set up, profiled and serving, and a fake pod client. The tests take them as fixtures
(tests/unit/conftest.py); the types come from here (``from kube_support import FakeKube``)."""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Mapping
from typing import Any

from packrat.controller.core.fanout import Answer
from packrat.controller.model.reconcile import Config, Reconciler, Result
from packrat.controller.planning.autobatch import Reading
from packrat.controller.serving import manifests
from packrat.controller.serving.admin_token import admin_token_secret
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint
from packrat.plan.traces import gamma_trace

NS = "ns"
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def merge(base: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping) or not isinstance(base, Mapping):
        return copy.deepcopy(patch)
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


class FakeKube:
    """An in-memory API server that bumps generation on spec changes."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.creates: list[tuple[str, str]] = []
        self.patches: list[tuple[str, str, dict[str, Any]]] = []

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((resource, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def create(self, resource: str, namespace: str, body: Mapping[str, Any]) -> bool:
        key = (resource, namespace, body["metadata"]["name"])
        if key in self.objects:
            return False
        obj = copy.deepcopy(dict(body))
        obj["metadata"]["generation"] = 1
        self.objects[key] = obj
        self.creates.append((resource, key[2]))
        return True

    def patch(
        self, resource: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return self._patch(resource, namespace, name, patch, status=False)

    def patch_status(
        self, resource: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return self._patch(resource, namespace, name, patch, status=True)

    def _patch(
        self, resource: str, namespace: str, name: str, patch: Mapping[str, Any], *, status: bool
    ) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key not in self.objects:
            return None
        old = self.objects[key]
        new = merge(old, patch)
        if not status and new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        meta = new["metadata"]
        added = set(meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
        if meta.get("deletionTimestamp") and added:  # as the API server: 422
            raise AssertionError(f"no new finalizers can be added while deleting {name}")
        self.patches.append((resource, name, copy.deepcopy(dict(patch))))
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.objects[key]  # the last finalizer removed: the object goes
            return copy.deepcopy(new)
        self.objects[key] = new
        return copy.deepcopy(new)

    def delete(
        self, resource: str, namespace: str, name: str, *, propagation: str = "Background"
    ) -> bool:
        """As the API server: an object with finalizers (or deleted in the foreground, which
        adds ``foregroundDeletion``) is only marked; ``collect`` plays the garbage collector."""
        obj = self.objects.get((resource, namespace, name))
        if obj is None:
            return False
        meta = obj["metadata"]
        if propagation == "Foreground" and "foregroundDeletion" not in (
            meta.get("finalizers") or []
        ):
            meta["finalizers"] = [*(meta.get("finalizers") or []), "foregroundDeletion"]
        if meta.get("finalizers"):
            meta.setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
        else:
            del self.objects[(resource, namespace, name)]
        return True

    def list(
        self, resource: str, namespace: str, *, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        out = []
        for (res, ns, _), obj in self.objects.items():
            have = obj["metadata"].get("labels") or {}
            if (
                res == resource
                and ns == namespace
                and all(have.get(k) == v for k, v in (labels or {}).items())
            ):
                out.append(copy.deepcopy(obj))
        return out

    def read_log(self, namespace: str, pod: str, *, container: str) -> str | None:
        return self.logs.get((pod, container))

    # -- playing the controllers --------------------------------------------------------------
    def of(self, resource: str) -> list[str]:
        return sorted(name for (res, _, name) in self.objects if res == resource)

    def finish_job(self, *, ok: bool, log: str = "", message: str = "") -> None:
        (job_name,) = self.of("jobs")
        pod = {
            "metadata": {"name": f"{job_name}-x", "labels": {"job-name": job_name}},
            "status": {
                "phase": "Succeeded" if ok else "Failed",
                "initContainerStatuses": [
                    {
                        "name": "profile",
                        "state": {
                            "terminated": {
                                "exitCode": 0 if ok else 137,
                                "reason": "Completed" if ok else "OOMKilled",
                                "message": message,
                            }
                        },
                    }
                ],
            },
        }
        self.objects[("pods", NS, pod["metadata"]["name"])] = pod
        self.logs[(pod["metadata"]["name"], "publish")] = log
        cond = "Complete" if ok else "Failed"
        self.patch_status(
            "jobs", NS, job_name, {"status": {"conditions": [{"type": cond, "status": "True"}]}}
        )

    def collect(self, dep_name: str) -> None:
        """The garbage collector done with a foreground delete: the pods are gone."""
        meta = self.objects[("deployments", NS, dep_name)]["metadata"]
        rest = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
        self.patch("deployments", NS, dep_name, {"metadata": {"finalizers": rest}})

    def make_ready(self, dep_name: str) -> None:
        dep = self.objects[("deployments", NS, dep_name)]
        replicas = dep["spec"]["replicas"]
        dep["status"] = {
            "observedGeneration": dep["metadata"]["generation"],
            "replicas": replicas,
            "readyReplicas": replicas,
            "updatedReplicas": replicas,
        }

    def prm(self) -> dict[str, Any]:
        obj = self.get("packratmodels", NS, "tiny")
        assert obj is not None
        return obj


#: the fake profile's latencies (ms) by (threads, batch)
_PROFILE_MS: dict[tuple[int, int], float] = {
    (1, 1): 1.0,
    (1, 2): 1.8,
    (1, 4): 3.5,
    (1, 8): 7.0,
    (2, 1): 0.8,
    (2, 2): 1.2,
    (2, 4): 2.2,
    (2, 8): 4.3,
}


def profile_json(changed_ms: Mapping[tuple[int, int], float] | None = None) -> str:
    """The fake ``tiny`` profile, with ``changed_ms`` (by (threads, batch)) replaced."""
    lat = {**_PROFILE_MS, **(changed_ms or {})}
    points = tuple(ProfilePoint(threads=t, batch=b, latency_ms=v) for (t, b), v in lat.items())
    meta = ProfileMeta(model="tiny", cpu_model="Test CPU", cpus=2)
    return Profile(meta=meta, points=points).to_json()


#: a model's fake API and its reconciler, as the fixtures hand them out
ModelSetUp = tuple[FakeKube, Reconciler]

#: the model ``tiny``'s default spec: 2 CPUs, batch 4, a quick switch
TINY_SPEC: dict[str, Any] = {
    "model": {"zoo": "tiny"},
    "cpus": 2,
    "batchSize": 4,
    "profiling": {"maxBatch": 8},
    "switch": {"readyTimeoutSeconds": 60, "drainSeconds": 5},
}


def unbatched_spec(**extra: Any) -> dict[str, Any]:
    """``TINY_SPEC`` without its batch size (the planner or autoBatch picks it), plus ``extra``."""
    base = {k: copy.deepcopy(v) for k, v in TINY_SPEC.items() if k != "batchSize"}
    return {**base, **extra}


def add_model(kube: FakeKube, spec: dict[str, Any], **options: Any) -> Reconciler:
    """Creates the PackratModel ``tiny`` with ``spec``; its reconciler (``Config(image="img")``
    unless ``config`` is given, other ``options`` passed on)."""
    body = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "tiny", "namespace": NS, "uid": "u1"},
        "spec": spec,
    }
    kube.create("packratmodels", NS, body)
    options.setdefault("config", Config(image="img"))
    return Reconciler(kube, **options)


def to_ready(kube: FakeKube, rec: Reconciler, now: datetime.datetime = T0) -> Result:
    """The first passes of ``tiny``: profiled (the profile of ``profile_json``), then serving
    from slot a."""
    rec.reconcile(NS, "tiny", now=now)
    kube.finish_job(ok=True, log=profile_json())
    rec.reconcile(NS, "tiny", now=now)
    kube.make_ready("tiny-a")
    return rec.reconcile(NS, "tiny", now=now)


def setup_model(spec: dict[str, Any] | None = None) -> ModelSetUp:
    """A fresh fake API holding ``tiny`` (``TINY_SPEC`` unless ``spec``), not reconciled yet."""
    kube = FakeKube()
    config = Config(image="img", profile_retry_seconds=10)
    return kube, add_model(kube, spec or copy.deepcopy(TINY_SPEC), config=config)


def ready_model() -> ModelSetUp:
    """``tiny`` profiled and serving (phase Ready)."""
    kube, rec = setup_model()
    assert to_ready(kube, rec).phase == "Ready"
    return kube, rec


def after(seconds: float) -> datetime.datetime:
    """``seconds`` after the tests' clock start ``T0``."""
    return T0 + datetime.timedelta(seconds=seconds)


def finish_switch(kube: FakeKube, rec: Reconciler, *, at: float) -> Result:
    """Plays a switch to its end: the target slot ready at ``at``, drained 10 s later."""
    slot = kube.prm()["status"]["switch"]["targetSlot"]
    kube.make_ready(f"tiny-{slot}")
    assert rec.reconcile(NS, "tiny", now=after(at)).phase == "Reconfiguring"  # service moved
    done = rec.reconcile(NS, "tiny", now=after(at + 10))  # after the drain period
    assert done.switch_result == "succeeded"
    return done


def gamma_burst(start: float, seconds: float, rate: float) -> list[float]:
    """Gamma arrivals at ``rate`` for ``seconds`` from ``start`` (epoch seconds), seeded by it."""
    return (start + gamma_trace(rate, duration_s=seconds, seed=int(start))).tolist()


class Feed:
    """A synthetic stream of per-pod estimates, one list per reconcile pass."""

    def __init__(self) -> None:
        self.next: list[int] | Reading | None = None

    def __call__(self, namespace: str, name: str) -> list[int] | Reading | None:
        return self.next


def set_spec(kube: FakeKube, **changes: Any) -> None:
    kube.patch("packratmodels", NS, "tiny", {"spec": changes})


ADMIN_TOKEN = "admin-token-0123456789abcdef"


def admin_secret(kube: Any, model: str, *, token: str = ADMIN_TOKEN) -> None:
    """The model's admin token Secret, as the operator makes it (owned by the model)."""
    owner = {"metadata": {"name": model, "namespace": NS}}
    kube.create("secrets", NS, admin_token_secret(owner, token=token, now=T0))


class FakeFanout:
    """The operator's pod client, answering from a table: ``estimates`` by pod address
    (``/status``), ``arrivals`` (``/arrivals``: offsets in ms after base 0) likewise; any
    other URL is unreachable. Records every URL asked (``asked``) and the headers sent with it
    (``headers``)."""

    def __init__(self) -> None:
        self.estimates: dict[str, Any] = {}
        self.arrivals: dict[str, list[float]] = {}
        self.asked: list[str] = []
        self.headers: list[dict[str, str]] = []  # sent with each URL asked

    def get(
        self,
        owner: str,
        urls: list[str],
        *,
        deadline: float,
        max_bytes: int,
        headers: Mapping[str, str] | None = None,
    ) -> list[Answer]:
        out = []
        for url in urls:
            self.asked.append(url)
            self.headers.append(dict(headers or {}))
            base, _, rest = url.partition("/status")
            doc: Any = None
            if not rest and url.endswith("/status") and base in self.estimates:
                doc = {"batch_size_estimate": {"estimate": self.estimates[base]}}
            elif "/arrivals" in url and url.partition("/arrivals")[0] in self.arrivals:
                doc = {"base": 0.0, "offsets_ms": self.arrivals[url.partition("/arrivals")[0]]}
            out.append(
                Answer(200, json.dumps(doc).encode())
                if doc is not None
                else Answer(0, error="unreachable")
            )
        return out


def serving_pod(
    name: str, *, ready: bool = True, slot: str = "a", going: bool = False
) -> dict[str, Any]:
    """A serving pod of model tiny's ``slot``, ready (or not), going away (or not)."""
    meta: dict[str, Any] = {"name": name, "labels": manifests.service_selector("tiny", slot=slot)}
    if going:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "phase": "Running",
            "podIP": f"10.0.0.{len(name)}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
