"""The CRDs' CEL rules (``x-kubernetes-validations``), read in Python.

A real API server evaluates these rules; the operator also checks objects that never passed one
(a CRD updated later, an emulator, ``packrat`` reading a YAML file). Evaluating CEL itself here
would bring cel-python and its google-re2, lark and pendulum into the operator image for some
thirty one-line rules, so each rule has its Python reading in :data:`READINGS`, keyed by the
rule's exact text. The CRD stays the one source of each rule and of its message (read from the
CRD, never copied here): a rule added to a CRD without a reading fails
``tests/unit/controller/api/test_api_schema_check.py``; ``tests/unit/deploy/test_crd_cel.py``
checks each reading against cel-python on valid and invalid objects.

A reading sees ``self`` as the API server does (the value at the rule's place, defaults filled
in); a value of the wrong type makes it raise, and the rule is then skipped (the schema check
has reported the type).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

Reading = Callable[[Any], bool]
_RESERVED_PREFIXES = ("packrat.dev/", "app.kubernetes.io/")
_OPERATOR_ENV = (
    *("HOME", "TMPDIR", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "MKL_NUM_THREADS"),
    *("KMP_AFFINITY", "GOMP_CPU_AFFINITY"),
)


def _one_of(obj: Mapping[str, Any], *keys: str) -> bool:
    return sum(key in obj for key in keys) == 1


def _unreserved(keys: Any) -> bool:
    return all(not str(k).startswith(_RESERVED_PREFIXES) for k in keys)


def _env_allowed(env: Any) -> bool:
    return all(not e["name"].startswith("PACKRAT_") and e["name"] not in _OPERATOR_ENV for e in env)


def _edges_join_stages(s: Any) -> bool:
    names = {stage["name"] for stage in s["stages"]}
    return "edges" not in s or all(e["from"] in names and e["to"] in names for e in s["edges"])


# rule text (as in the CRD) -> its reading; ``s`` is CEL's ``self``
READINGS: dict[str, Reading] = {
    # PackratModel
    "self.metadata.name.size() <= 40": lambda s: len(s["metadata"]["name"]) <= 40,
    "has(self.slo) || has(self.batchSize) != has(self.autoBatch)": lambda s: (
        "slo" in s or ("batchSize" in s) != ("autoBatch" in s)
    ),
    "!has(self.slo) || !has(self.batchSize)": lambda s: "slo" not in s or "batchSize" not in s,
    "!has(self.autoscaling) || self.autoscaling.mode != 'envelope' || has(self.slo)"
    " || has(self.autoscaling.reference)": lambda s: (
        "autoscaling" not in s
        or s["autoscaling"]["mode"] != "envelope"
        or "slo" in s
        or "reference" in s["autoscaling"]
    ),
    "!has(self.autoscaling) || !has(self.autoscaling.reference)"
    " || (!has(self.slo) && self.autoscaling.mode == 'envelope')": lambda s: (
        "autoscaling" not in s
        or "reference" not in s["autoscaling"]
        or ("slo" not in s and s["autoscaling"]["mode"] == "envelope")
    ),
    "!has(self.batchSize) || self.batchSize <= self.profiling.maxBatch": lambda s: (
        "batchSize" not in s or s["batchSize"] <= s["profiling"]["maxBatch"]
    ),
    "!has(self.autoBatch) || self.autoBatch.max <= self.profiling.maxBatch": lambda s: (
        "autoBatch" not in s or s["autoBatch"]["max"] <= s["profiling"]["maxBatch"]
    ),
    "!has(self.profiling.threads) || self.profiling.threads.all(t, t <= self.cpus)": lambda s: (
        "threads" not in s["profiling"] or all(t <= s["cpus"] for t in s["profiling"]["threads"])
    ),
    "[has(self.zoo), has(self.uri), has(self.volume), has(self.storageUri)]"
    ".filter(x, x).size() == 1": lambda s: _one_of(s, "zoo", "uri", "volume", "storageUri"),
    "has(self.zoo) || has(self.format)": lambda s: "zoo" in s or "format" in s,
    "!has(self.zoo) || !has(self.format)": lambda s: "zoo" not in s or "format" not in s,
    "has(self.storageUri) || (!has(self.credentialsSecret) && !has(self.digest))": lambda s: (
        "storageUri" in s or ("credentialsSecret" not in s and "digest" not in s)
    ),
    "!has(self.storageUri) || !self.storageUri.startsWith('pvc://')"
    " || !has(self.credentialsSecret)": lambda s: (
        "storageUri" not in s
        or not s["storageUri"].startswith("pvc://")
        or "credentialsSecret" not in s
    ),
    "has(self.persistentVolumeClaim) != has(self.configMap)": lambda s: _one_of(
        s, "persistentVolumeClaim", "configMap"
    ),
    "!self.contains('..')": lambda s: ".." not in s,
    "self.min <= self.max": lambda s: s["min"] <= s["max"],
    "has(self.trace) != has(self.rate)": lambda s: _one_of(s, "trace", "rate"),
    "self.minReplicas <= self.maxReplicas": lambda s: s["minReplicas"] <= s["maxReplicas"],
    "!has(self.reference) || self.reference.windowsSeconds.size()"
    " == self.reference.ratesPerSecond.size()": lambda s: (
        "reference" not in s
        or len(s["reference"]["windowsSeconds"]) == len(s["reference"]["ratesPerSecond"])
    ),
    "!has(self.labels) || self.labels.all(k, !k.startsWith('packrat.dev/')"
    " && !k.startsWith('app.kubernetes.io/'))": lambda s: (
        "labels" not in s or _unreserved(s["labels"])
    ),
    "!has(self.annotations) || self.annotations.all(k, !k.startsWith('packrat.dev/')"
    " && !k.startsWith('app.kubernetes.io/'))": lambda s: (
        "annotations" not in s or _unreserved(s["annotations"])
    ),
    "!has(self.env) || self.env.all(e, !e.name.startsWith('PACKRAT_') && !(e.name in ['HOME',"
    " 'TMPDIR', 'PYTHONUNBUFFERED', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'KMP_AFFINITY',"
    " 'GOMP_CPU_AFFINITY']))": lambda s: "env" not in s or _env_allowed(s["env"]),
    "has(self.value) != has(self.valueFrom)": lambda s: _one_of(s, "value", "valueFrom"),
    "!self.exists(e, e == 'all') || size(self) == 1": lambda s: "all" not in s or len(s) == 1,
    "!has(self.artefactsClaim) || (has(self.engines) && self.engines != ['eager'])": lambda s: (
        "artefactsClaim" not in s or ("engines" in s and list(s["engines"]) != ["eager"])
    ),
    # PackratPipeline
    "self.metadata.name.size() <= 19": lambda s: len(s["metadata"]["name"]) <= 19,
    "!has(self.edges) || self.edges.all(e, self.stages.exists(s, s.name == e.from)"
    " && self.stages.exists(s, s.name == e.to))": _edges_join_stages,
    "self.name != 'router'": lambda s: s["name"] != "router",
    "!has(self.batchSize) && !has(self.autoBatch) && !has(self.slo) && !has(self.replicas)"
    " && !has(self.autoscaling)": lambda s: (
        not any(k in s for k in ("batchSize", "autoBatch", "slo", "replicas", "autoscaling"))
    ),
    "self.from != self.to": lambda s: s["from"] != s["to"],
    "has(self.header) != has(self.json)": lambda s: _one_of(s, "header", "json"),
    "(has(self.equals) ? 1 : 0) + (has(self.below) ? 1 : 0) + (has(self.above) ? 1 : 0)"
    " == 1": lambda s: _one_of(s, "equals", "below", "above"),
}


def rules_at(
    schema: Mapping[str, Any], value: Any, where: str
) -> Iterator[tuple[Mapping[str, Any], Any, str]]:
    """(rule, self, path) for every CEL rule under ``schema`` that applies to ``value``
    (every element under an array, every value under a map), as the API server binds them.
    A value of another type than its node declares binds no rule there: the schema check
    reports it once (a string where an object belongs is not "missing every field")."""
    if not _of_declared_type(schema, value):
        return
    for rule in schema.get("x-kubernetes-validations") or []:
        yield rule, value, where
    if isinstance(value, Mapping):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                yield from rules_at(sub, value[name], f"{where}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            known = set(schema.get("properties") or {})
            for name, item in value.items():
                if name not in known:
                    yield from rules_at(extra, item, f"{where}.{name}")
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        for i, item in enumerate(value):
            yield from rules_at(items, item, f"{where}[{i}]")


_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": Mapping,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


def _of_declared_type(schema: Mapping[str, Any], value: Any) -> bool:
    declared = _TYPES.get(schema.get("type", ""))
    if declared is None:
        return True  # no type, or x-kubernetes-int-or-string and the like
    if isinstance(value, bool) and schema.get("type") != "boolean":
        return False
    return isinstance(value, declared)


def rule_errors(schema: Mapping[str, Any], value: Any, where: str) -> list[str]:
    """A message (``where: the CRD's message``) for every CEL rule under ``schema`` that
    ``value`` breaks. A rule without a reading raises KeyError: the tests catch it."""
    errors: list[str] = []
    for rule, self_, path in rules_at(schema, value, where):
        reading = READINGS[rule["rule"]]
        try:
            ok = reading(self_)
        except (KeyError, TypeError, AttributeError, IndexError):
            continue  # a value of the wrong type: the schema check reports it
        if not ok:
            errors.append(f"{path}: {rule.get('message', rule['rule'])}")
    return errors
