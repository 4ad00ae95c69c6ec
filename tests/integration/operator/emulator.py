"""The kmock 0.8 Kubernetes API emulator with the compatibility layer the operator needs.

kmock stores objects and streams watch events but leaves out what a real API server adds:
this layer fills ``metadata.namespace``, ``uid``, ``resourceVersion``, ``creationTimestamp`` and
``generation`` (bumped when a patch touches ``spec``), serves ``pods/{name}/log`` from what the
test agent recorded, and declares the resources (kmock does not add a POSTed CRD to discovery).
kmock itself honours finalizers on every resource (a DELETE only sets ``deletionTimestamp``
while any is left; the object goes when a patch removes the last); this layer adds foreground
deletion, the ``resourceVersion`` precondition of a patch and the refusal of new finalizers on
an object being deleted (``_admit``), and label selectors on lists and watch streams
(``labelSelector``: ``k=v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``; a real
API server filters there, and the operator asks it to), counting the watch events each
client was sent (``watch_events``, and the items of list answers, ``listed_items``).
It runs on its own event loop in a background thread; ``Api`` is a small blocking client for
the tests and the agent.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import re
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import enums, rendering

RESOURCES = {
    "packrat.dev/v1alpha1/packratmodels": ("PackratModel", {"status"}),
    "packrat.dev/v1alpha1/packratpipelines": ("PackratPipeline", {"status"}),
    "packrat.dev/v1alpha1/packratpools": ("PackratPool", {"status"}),
    "v1/configmaps": ("ConfigMap", set()),
    "v1/secrets": ("Secret", set()),
    "v1/services": ("Service", set()),
    "v1/pods": ("Pod", {"status", "log"}),
    "v1/events": ("Event", set()),
    "batch/v1/jobs": ("Job", {"status"}),
    "apps/v1/deployments": ("Deployment", {"status", "scale"}),
    "v1/namespaces": ("Namespace", set()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", set()),
}
CLUSTER_SCOPED = {"v1/namespaces", "apiextensions.k8s.io/v1/customresourcedefinitions"}
PATHS = {
    "packratmodels": "/apis/packrat.dev/v1alpha1",
    "packratpipelines": "/apis/packrat.dev/v1alpha1",
    "packratpools": "/apis/packrat.dev/v1alpha1",
    "configmaps": "/api/v1",
    "secrets": "/api/v1",
    "services": "/api/v1",
    "pods": "/api/v1",
    "events": "/api/v1",
    "jobs": "/apis/batch/v1",
    "deployments": "/apis/apps/v1",
}


_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    """The requirements of a selector: commas separate them, except inside ``( )``."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p.strip() for p in [*parts, current] if p.strip()]


def label_matcher(selector: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """A test of an object's labels against a Kubernetes label selector."""
    reqs: list[tuple[str, str, frozenset[str]]] = []  # (operator, key, values)
    for req in _split_selector(selector or ""):
        found = _SET_RE.match(req)
        if found:
            values = frozenset(v.strip() for v in found[3].split(","))
            reqs.append((found[2], found[1], values))
        elif "!=" in req:
            key, value = (x.strip() for x in req.split("!=", 1))
            reqs.append(("!=", key, frozenset({value})))
        elif "=" in req:
            key, value = (x.strip() for x in req.replace("==", "=").split("=", 1))
            reqs.append(("=", key, frozenset({value})))
        elif req.startswith("!"):
            reqs.append(("absent", req[1:].strip(), frozenset()))
        else:
            reqs.append(("present", req, frozenset()))

    def holds(op: str, key: str, values: frozenset[str], labels: Mapping[str, str]) -> bool:
        if op in ("=", "in"):
            return labels.get(key) in values
        if op in ("!=", "notin"):
            return labels.get(key) not in values
        return (key in labels) == (op == "present")

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(holds(op, key, values, labels) for op, key, values in reqs)

    return matches


class CompatEmulator(kmock.KubernetesEmulator):
    """kmock plus the metadata a real API server maintains, and pod logs.

    It also keeps kmock's request log short. kmock records every request for assertions and
    finds the reaction for each new one by scanning that whole log once per candidate reaction
    (``request in payload._source``), so a request's cost grows with the number served before
    it: after a few minutes of an operator, an agent and a status poller talking to it, one
    request took about 0.3 s of CPU and the test process used a whole core, competing with the
    serving pods it was supposed to stand beside. Nothing here asserts on that log, so beyond
    ``HISTORY`` entries it is cut down to the requests still being handled (whose reaction
    lookup may still need them).
    """

    HISTORY = 16

    def setup(self) -> None:
        self.pod_logs: dict[tuple[str, str, str], str] = {}
        self.faults: list[list[Any]] = []  # [method, path part, times left, status]
        self.requests_failed = 0
        self.request_counts: dict[tuple[str, str, bool, str], int] = {}
        # watch events sent, by (resource path, client); the selectors each watch asked for
        self.watch_events: dict[tuple[str, str], int] = {}
        self.watch_selectors: dict[str, set[str]] = {}
        self.listed_items: dict[tuple[str, str], int] = {}  # items sent in list answers
        self._in_flight: set[int] = set()
        self._versions = itertools.count(1)
        for key, (kind, subresources) in RESOURCES.items():
            self.resources[key] = kmock.ResourceInfo(
                kind=kind,
                namespaced=key not in CLUSTER_SCOPED,
                verbs={"list", "watch", "get", "create", "patch", "delete"},
                subresources=subresources,
            )

    def _trim_history(self) -> None:
        if len(self._requests) > self.HISTORY:
            self._requests[:] = [r for r in self._requests if id(r) in self._in_flight]
            for payload in self._payloads:
                payload._requests.clear()  # kept by kmock for assertions only

    def fail_next(self, method: str, path_part: str, *, times: int = 1, status: int = 500) -> None:
        """Answer the next ``times`` requests of ``method`` whose path contains ``path_part``
        with ``status`` (a transient API server error)."""
        self.faults.append([method.upper(), path_part, times, status])

    def _fault(self, request: rendering.Request) -> int | None:
        path = str(request.url.path)
        verb = str(getattr(request.method, "value", request.method)).upper()
        for fault in self.faults:
            method, part, times, status = fault
            if times > 0 and verb == method and part in path and "watch" not in request.params:
                fault[2] -= 1
                self.requests_failed += 1
                return int(status)
        return None

    def count(self, request: rendering.Request) -> None:
        """Count requests by verb, resource path (without the object's name), watch or not,
        and client (the User-Agent's product: the tests' client is Python-urllib)."""
        parts = [x for x in str(request.url.path).split("/") if x]
        if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
            parts = parts[: parts.index("namespaces") + 3]  # .../namespaces/NS/PLURAL
        verb = str(getattr(request.method, "value", request.method)).upper()
        agent = str(request.headers.get("User-Agent", ""))
        key = (verb, "/".join(parts), "watch" in request.params, agent.split("/", maxsplit=1)[0])
        self.request_counts[key] = self.request_counts.get(key, 0) + 1

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        self.count(request)
        status = self._fault(request) if self.faults else None
        if status is not None:
            return aiohttp.web.json_response(
                {"kind": "Status", "code": status, "message": "injected fault"}, status=status
            )
        self._in_flight.add(id(request))
        try:
            self._trim_history()
            return await self._handle_compat(request)
        finally:
            self._in_flight.discard(id(request))

    async def _handle_compat(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None:
            refused = self._admit(request)
            if refused is not None:
                return refused
            if request.subresource == "log" and request.method == enums.method.GET:
                container = request.params.get("container", "")
                text = self.pod_logs.get((request.namespace or "", request.name or "", container))
                if text is None:
                    return aiohttp.web.json_response(
                        {"kind": "Status", "code": 404, "message": "no log"}, status=404
                    )
                return aiohttp.web.Response(text=text, content_type="text/plain")
            data = request.data if isinstance(request.data, dict) else None
            if request.action == enums.action.CREATE and data is not None:
                meta = data.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:8]
                if request.namespace:
                    meta.setdefault("namespace", request.namespace)
                meta.setdefault("uid", str(uuid.uuid4()))
                meta["resourceVersion"] = str(next(self._versions))
                meta.setdefault(
                    "creationTimestamp",
                    datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                )
                meta["generation"] = 1
            elif request.action == enums.action.UPDATE and data is not None:
                key = (request.resource, request.namespace, request.name)
                if key in self.objects and not self.objects[key].deleted:
                    current = self.objects[key].raw
                    meta = data.setdefault("metadata", {})
                    meta["resourceVersion"] = str(next(self._versions))
                    if request.subresource is None and "spec" in data:
                        generation = int(current.get("metadata", {}).get("generation") or 1)
                        meta["generation"] = generation + 1
        return await super()._handle(request)

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector and isinstance(payload, dict):
            matches = label_matcher(selector)
            payload = {**payload, "items": [o for o in payload["items"] if matches(o)]}
        if isinstance(payload, dict):
            path = "/".join(x for x in str(request.url.path).split("/") if x)
            agent = str(request.headers.get("User-Agent", "")).split("/", maxsplit=1)[0]
            key = (path, agent)
            self.listed_items[key] = self.listed_items.get(key, 0) + len(payload["items"])
        return payload

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        selector = request.params.get("labelSelector")
        matches = label_matcher(selector)
        path = "/".join(x for x in str(request.url.path).split("/") if x)
        agent = str(request.headers.get("User-Agent", "")).split("/", maxsplit=1)[0]
        self.watch_selectors.setdefault(path, set()).add(selector or "")
        async for event in super()._serve_watch(request):
            if isinstance(event, dict):
                if not matches(event.get("object") or {}):
                    continue
                key = (path, agent)
                self.watch_events[key] = self.watch_events.get(key, 0) + 1
            yield event

    def _admit(self, request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        """What the API server does on its own before kmock stores anything: a DELETE in the
        foreground adds ``foregroundDeletion`` (kmock then only marks the object, as for any
        finalizer, and the agent's garbage collector deletes the dependents and removes it);
        a PATCH is refused with 409 when it carries a stale ``metadata.resourceVersion`` (an
        optimistic lock), and with 422 when it adds a finalizer to an object being deleted."""
        key = (request.resource, request.namespace, request.name)
        if request.name is None or key not in self.objects or self.objects[key].deleted:
            return None
        current = self.objects[key].raw
        meta = current.get("metadata") or {}
        data = request.data if isinstance(request.data, dict) else {}
        if request.action == enums.action.DELETE:
            policy = data.get("propagationPolicy") or request.params.get("propagationPolicy")
            finalizers = list(meta.get("finalizers") or [])
            if meta.get("deletionTimestamp"):
                return None
            if policy == "Foreground" and "foregroundDeletion" not in finalizers:
                finalizers.append("foregroundDeletion")
            if finalizers:  # kmock marks it: a new version, as the API server's
                version = str(next(self._versions))
                self.objects[key].patch(
                    {"metadata": {"finalizers": finalizers, "resourceVersion": version}}
                )
            return None
        if request.action != enums.action.UPDATE:
            return None
        want = data.get("metadata") or {}
        version = want.get("resourceVersion")
        if version and str(version) != str(meta.get("resourceVersion")):
            return self._status(409, f"the object has been modified ({version} is stale)")
        added = set(want.get("finalizers") or []) - set(meta.get("finalizers") or [])
        if added and meta.get("deletionTimestamp"):
            return self._status(
                422, "Forbidden: no new finalizers can be added if the object is being deleted"
            )
        return None

    @staticmethod
    def _status(code: int, message: str) -> aiohttp.web.StreamResponse:
        body = {"kind": "Status", "apiVersion": "v1", "code": code, "message": message}
        return aiohttp.web.json_response(body, status=code)


class EmulatorThread:
    """Runs the emulator and its HTTP server on a private event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.emulator: CompatEmulator | None = None
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)

    def start(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("kmock did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with CompatEmulator() as emulator, kmock.Server(emulator) as server:
            emulator.setup()
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def write_kubeconfig(self, path: Path, *, namespace: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [
                {
                    "name": "kmock",
                    "context": {"cluster": "kmock", "user": "test", "namespace": namespace},
                }
            ],
            "current-context": "kmock",
        }
        path.write_text(json.dumps(config))
        return path


class Api:
    """A tiny blocking JSON client for the emulator (tests and the agent)."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace

    def _path(self, resource: str, name: str | None = None, sub: str | None = None) -> str:
        path = f"{self.url}{PATHS[resource]}/namespaces/{self.namespace}/{resource}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    def _call(
        self, method: str, url: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return json.loads(text) if text else None

    def get(self, resource: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._call("GET", self._path(resource, name))
        return result

    def list(self, resource: str, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        payload = self._call("GET", self._path(resource)) or {}
        items: list[dict[str, Any]] = payload.get("items") or []
        return [
            i
            for i in items
            if all(
                (i.get("metadata", {}).get("labels") or {}).get(k) == v
                for k, v in (labels or {}).items()
            )
        ]

    def create(self, resource: str, body: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", self._path(resource), dict(body))
        return result

    def patch(
        self, resource: str, name: str, patch: Mapping[str, Any], *, sub: str | None = None
    ) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._call(
            "PATCH", self._path(resource, name, sub), dict(patch), "application/merge-patch+json"
        )
        return result

    def delete(self, resource: str, name: str, *, propagation: str | None = None) -> None:
        """DELETE; ``propagation`` is the cascade (``kubectl delete --cascade``): Background
        when None, as the API server's default for Deployments."""
        body = None
        if propagation is not None:
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            self._call("DELETE", self._path(resource, name), body)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
