"""The Helm chart, checked offline: rendered with Helm's own Go code (helm-python-sdk), linted
strictly, every object validated against the Kubernetes schemas, security and RBAC rules
asserted, and the values schema shown to reject bad input.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging_support import (
    CHART_DIR,
    CUSTOM_KINDS,
    NAMESPACE,
    RELEASE,
    ROOT,
    all_containers,
    by_kind,
    helm_home,
    load_script,
    pod_spec,
    render_chart,
    render_objects,
)

helm_python = pytest.importorskip("helm_python")

K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

MONITORS: dict[str, Any] = {
    "metrics": {
        "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}},
        "podMonitor": {"enabled": True, "additionalLabels": {"release": "kps", "team": "ml"}},
    }
}
VARIATIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaces": {"watchNamespaces": ["models-a", "models-b"]},
    "monitors": MONITORS,
    "pdb": {
        "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
        "replicaCount": 2,
        "peering": {"enabled": True},
    },
    "image": {
        "image": {"repository": "registry.example.com/ops/packrat", "tag": "9.9.9"},
        "servingImage": {
            "repository": "registry.example.com/ops/serving",
            "digest": "sha256:" + "a" * 64,
        },
        "imagePullSecrets": [{"name": "regcred"}],
    },
    "ha": {
        "replicaCount": 2,
        "peering": {"enabled": True, "name": "packrat-ha", "priority": 10},
        "podDisruptionBudget": {"enabled": True},
        "watchNamespaces": ["models-a"],
        **MONITORS,
    },
    "ha-cluster": {"replicaCount": 3, "peering": {"enabled": True}},
    "observability": {
        **MONITORS,
        "dashboards": {"enabled": True, "annotations": {"grafana_folder": "Packrat"}},
        "prometheusRule": {
            "enabled": True,
            "additionalLabels": {"release": "kps"},
            "alertLabels": {"team": "ml"},
        },
    },
    "netpol": {
        "watchNamespaces": ["models-a"],
        "networkPolicy": {
            "modelNamespaces": ["models-a", "models-b"],
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
            ],
            "servingFrom": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
        },
    },
    "no-tests-verbose": {
        "tests": {"enabled": False},
        "operator": {"verbose": True, "extraArgs": []},
    },
    "locked-down": {
        "storage": {
            "egressAllow": ["10.96.0.0/12"],
            "hosts": ["minio.storage.svc", ".models.example.com"],
            "maxModelBytes": 2147483648,
            "cloudIdentity": "metadata",
        },
        "pipelinePlanner": {"seconds": 30, "memoryMiB": 256},
        "modelPolicy": {
            "images": ["registry.example.com/packrat/*"],
            "serviceAccounts": [],
            "priorityClasses": ["serving"],
            "envSecrets": None,
        },
    },
}


@pytest.fixture(scope="module", autouse=True)
def _helm_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with helm_home(tmp_path_factory.mktemp("helm")):
        yield


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render_objects(values) for name, values in VARIATIONS.items()}


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _operator_args(objects: list[dict[str, Any]]) -> list[str]:
    deployment = _one(objects, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args: list[str] = container["args"]
    return args


# ---------------------------------------------------------------------------- lint and schema


@pytest.mark.parametrize("variation", sorted(VARIATIONS))
def test_lint_strict_passes(variation: str) -> None:
    report = helm_python.lint(
        CHART_DIR, VARIATIONS[variation], strict=True, namespace=NAMESPACE, kube_version="v1.30.0"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


def test_lint_reports_bad_values() -> None:
    report = helm_python.lint(CHART_DIR, {"replicaCount": "two"}, strict=True)
    assert report["errors"], "lint accepted replicaCount: two"


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicaCount": "two"}, "/replicaCount"),
        ({"watchNamespaces": "models"}, "/watchNamespaces"),
        ({"metrics": {"port": "9090"}}, "/metrics/port"),
        ({"image": {"tag": 3}}, "/image/tag"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "/metrics/serviceMonitor/enabled"),
        ({"resources": {"limits": {"cpu": True}}}, "/resources/limits/cpu"),
        ({"adminToken": {"rotationSeconds": 60}}, "/adminToken/rotationSeconds"),
    ],
)
def test_values_schema_rejects_wrong_types(values: dict[str, Any], where: str) -> None:
    with (
        helm_python.Chart.load(CHART_DIR) as chart,
        pytest.raises(helm_python.HelmValuesError) as e,
    ):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert where in str(e.value)


@pytest.mark.parametrize(
    "values",
    [
        {"replicas": 1},  # a typo of replicaCount
        {"metrics": {"serviceMonitor": {"enabeld": True}}},
        {"image": {"repo": "x"}},
        {"podDisruptionBudget": {"maxUnavailable": 1}},
        {"resources": {"limits": {"gpu": 1}}},
    ],
)
def test_values_schema_rejects_unknown_keys(values: dict[str, Any]) -> None:
    with (
        helm_python.Chart.load(CHART_DIR) as chart,
        pytest.raises(helm_python.HelmValuesError) as e,
    ):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert "additional properties" in str(e.value)


def _keys(values: Any, prefix: str = "") -> set[str]:
    if not isinstance(values, dict) or not values:
        return {prefix} if prefix else set()
    out: set[str] = set()
    for key, value in values.items():
        out |= _keys(value, f"{prefix}.{key}" if prefix else key)
    return out


def _schema_has(schema: dict[str, Any], dotted: str) -> bool:
    node = schema
    for part in dotted.split("."):
        props = node.get("properties", {})
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return False
    return True


def test_every_default_value_is_in_the_schema_and_documented() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values_text = (CHART_DIR / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    missing = sorted(k for k in _keys(values) if not _schema_has(schema, k))
    assert missing == []
    # Field by field: every leaf key line in values.yaml has a comment line right above it.
    lines = values_text.splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or line.startswith(" " * 4 + "-"):
            continue
        if ":" in stripped and i > 0 and not lines[i - 1].strip().startswith("#"):
            key = stripped.split(":")[0]
            parent_block = stripped.endswith(":")  # a mapping header documented as a block
            if not parent_block and key not in {"cpu", "memory"}:
                undocumented.append(key)
    assert undocumented == []
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(chart.merge_values({}))


def test_pdb_that_would_block_drains_is_refused() -> None:
    values = {"podDisruptionBudget": {"enabled": True, "minAvailable": 1}}
    with helm_python.Chart.load(CHART_DIR) as chart, pytest.raises(helm_python.HelmError) as e:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert "block every node drain" in str(e.value)


def test_replicas_spread_over_nodes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    spec = _one(rendered["ha"], "Deployment")["spec"]["template"]["spec"]
    term = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    pod_labels = _one(rendered["ha"], "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = term[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert "affinity" not in _one(rendered["default"], "Deployment")["spec"]["template"]["spec"]


def test_more_replicas_need_peering() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart, pytest.raises(helm_python.HelmError) as e:
        chart.render({"replicaCount": 2}, name=RELEASE, namespace=NAMESPACE)
    assert "peering" in str(e.value)


# ---------------------------------------------------------------------------- Kubernetes schemas


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variation", sorted(VARIATIONS))
def test_every_object_is_valid_kubernetes(
    rendered: dict[str, list[dict[str, Any]]], variation: str, version: str
) -> None:
    checked = 0
    for obj in rendered[variation]:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    assert checked >= 5  # Deployment, ServiceAccount, ClusterRole(Binding), Service


def test_test_hook_is_valid_and_annotated(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pods = by_kind(rendered["default"], "Pod")
    assert len(pods) == 1
    assert pods[0]["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert by_kind(rendered["no-tests-verbose"], "Pod") == []


def _check_monitor_shape(monitor: dict[str, Any], *, endpoints_key: str) -> None:
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    spec = monitor["spec"]
    assert set(spec) == {"namespaceSelector", "selector", endpoints_key}
    assert isinstance(spec["selector"]["matchLabels"], dict)
    for endpoint in spec[endpoints_key]:
        allowed = {"port", "path", "interval", "scrapeTimeout", "relabelings", "honorLabels"}
        assert set(endpoint) <= allowed
        assert isinstance(endpoint["port"], str) and endpoint["path"] == "/metrics"
        for duration in (endpoint["interval"], endpoint["scrapeTimeout"]):
            assert isinstance(duration, str) and duration[-1] in "smh"


def test_monitors_shape_selectors_and_additional_labels(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["monitors"]
    service = next(o for o in objects if o["kind"] == "Service")
    smon = _one(objects, "ServiceMonitor")
    _check_monitor_shape(smon, endpoints_key="endpoints")
    assert smon["metadata"]["labels"]["release"] == "kps"
    assert smon["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert smon["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert smon["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}

    pmon = _one(objects, "PodMonitor")
    _check_monitor_shape(pmon, endpoints_key="podMetricsEndpoints")
    assert pmon["metadata"]["labels"]["release"] == "kps"
    assert pmon["metadata"]["labels"]["team"] == "ml"
    selector = pmon["spec"]["selector"]
    assert selector["matchLabels"] == {"app.kubernetes.io/managed-by": "packrat-operator"}
    assert selector["matchExpressions"] == [
        {
            "key": "app.kubernetes.io/name",
            "operator": "In",
            "values": ["packrat-serving", "packrat-router"],
        }
    ]
    assert pmon["spec"]["namespaceSelector"] == {"any": True}
    # In namespaced mode it scrapes exactly the watched namespaces.
    ha = _one(rendered["ha"], "PodMonitor")
    assert ha["spec"]["namespaceSelector"] == {"matchNames": ["models-a"]}
    # Off by default: no dependency on the prometheus-operator CRDs.
    kinds = {o["kind"] for o in rendered["default"]}
    assert not kinds & {"ServiceMonitor", "PodMonitor"}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and In expressions) against pod labels."""
    if not selector["matchLabels"].items() <= labels.items():
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def test_podmonitor_matches_the_serving_pods_and_routers_the_operator_builds(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    manifests = pytest.importorskip("packrat.controller.serving.manifests")
    pipeline_manifests = pytest.importorskip("packrat.controller.pipeline.manifests")
    owner = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "resnet50", "namespace": "models-a", "uid": "u-1"},
        "spec": {"model": {"zoo": "resnet50"}, "cpus": 4, "batchSize": 8},
    }
    typed = pytest.importorskip("packrat.controller.core.model").parse(owner)
    deployment = manifests.serving_deployment(typed, slot="a", serving_hash="h" * 16, replicas=1)
    template = deployment["spec"]["template"]
    pmon = _one(rendered["monitors"], "PodMonitor")
    selector = pmon["spec"]["selector"]
    assert _selects(selector, template["metadata"]["labels"])
    port_names = {p.get("name") for c in template["spec"]["containers"] for p in c.get("ports", [])}
    assert pmon["spec"]["podMetricsEndpoints"][0]["port"] in port_names
    relabels = pmon["spec"]["podMetricsEndpoints"][0]["relabelings"]
    for relabel in relabels:
        label = relabel["sourceLabels"][0].removeprefix("__meta_kubernetes_pod_label_")
        assert any(
            label == k.replace(".", "_").replace("/", "_").replace("-", "_")
            for k in template["metadata"]["labels"]
        ), label
    assert {r["targetLabel"] for r in relabels} >= {"packratmodel"}
    # the pipeline routers too (packrat_pipeline_* reaches Prometheus), on the same port name
    pipeline = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratPipeline",
        "metadata": {"name": "cascade", "namespace": "models-a", "uid": "u-2"},
        "spec": {
            "stages": [{"name": "screen", "model": {"model": {"zoo": "tiny"}, "cpus": 2}}],
            "slo": {"latencyP99Ms": 500, "rate": 20},
        },
    }
    pipeline_spec = pytest.importorskip("packrat.controller.pipeline.spec")
    typed_pipeline = pipeline_spec.parse_pipeline(pipeline)
    router = pipeline_manifests.router_deployment(typed_pipeline, image="img:1")
    router_template = router["spec"]["template"]
    assert _selects(selector, router_template["metadata"]["labels"])
    router_ports = {p["name"] for c in router_template["spec"]["containers"] for p in c["ports"]}
    assert pmon["spec"]["podMetricsEndpoints"][0]["port"] in router_ports
    # and nothing else the operator runs: profiling pods are not scraped
    profiling = manifests.base_labels("resnet50", app=manifests.PROFILING_APP)
    assert not _selects(selector, profiling)


def test_peering_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # the chart renders neither kopf's peering CRDs nor a peering object: the CRDs are in its
    # crds/ folder (and the packrat-crds chart), the operator creates the object at start
    ha = rendered["ha"]
    assert not by_kind(ha, "CustomResourceDefinition")
    assert not by_kind(ha, "KopfPeering") and not by_kind(
        rendered["ha-cluster"], "ClusterKopfPeering"
    )
    with helm_python.Chart.load(CHART_DIR) as chart:
        crds = {yaml.safe_load(c["data"])["metadata"]["name"] for c in chart.crds}
    assert {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"} <= crds
    args = _operator_args(ha)
    assert "--peering=packrat-ha" in args and "--namespace=models-a" in args
    env = _one(ha, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "PACKRAT_PEERING_PRIORITY", "value": "10"} in env
    assert not any(a.startswith("--peering") for a in _operator_args(rendered["default"]))
    assert _one(ha, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    assert _one(rendered["default"], "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    assert not by_kind(rendered["default"], "CustomResourceDefinition")


def _crd_kinds(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {
        d["spec"]["names"]["kind"]: d["metadata"]["name"]
        for d in docs
        if d and d.get("kind") == "CustomResourceDefinition"
    }


@functools.cache
def _chart_crd_kinds() -> dict[str, str]:
    with helm_python.Chart.load(CHART_DIR) as chart:
        return _crd_kinds([yaml.safe_load(c["data"]) for c in chart.crds])


def _release_clashes(objects: list[dict[str, Any]]) -> list[str]:
    """Objects whose kind a CRD of the same release defines (its templates or crds/ folder)."""
    defined = {**_chart_crd_kinds(), **_crd_kinds(objects)}
    assert {"PackratModel", "KopfPeering", "ClusterKopfPeering"} <= defined.keys()
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objects if o["kind"] in defined]


@pytest.mark.parametrize("variation", sorted(VARIATIONS))
def test_no_custom_object_in_the_release_that_defines_its_kind(
    rendered: dict[str, list[dict[str, Any]]], variation: str
) -> None:
    """On a fresh cluster Helm refuses a release with an object whose kind a CRD of the same
    release defines ("no matches for kind ... ensure CRDs are installed first")."""
    assert _release_clashes(rendered[variation]) == [], variation
    # not vacuous: the chart as it was (a ClusterKopfPeering rendered beside kopf's CRDs) fails
    old = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "p"}}
    assert _release_clashes([*rendered[variation], old]) == ["ClusterKopfPeering/p"]


def test_pdb_selects_the_operator_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pdb = _one(rendered["pdb"], "PodDisruptionBudget")
    pod_labels = _one(rendered["pdb"], "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["minAvailable"] == 1
    assert not by_kind(rendered["default"], "PodDisruptionBudget")


# ---------------------------------------------------------------------------- pod security


@pytest.mark.parametrize("variation", sorted(VARIATIONS))
def test_pods_are_locked_down(rendered: dict[str, list[dict[str, Any]]], variation: str) -> None:
    pods = [(o, spec) for o in rendered[variation] if (spec := pod_spec(o)) is not None]
    assert pods
    for obj, spec in pods:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["runAsUser"] > 0, where
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        mounts_tmp = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for container in all_containers(spec):
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in sc["capabilities"], where
            assert sc["runAsNonRoot"] is True, where
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
            limits = container["resources"]["limits"]
            requests = container["resources"]["requests"]
            assert {"cpu", "memory"} <= limits.keys() and {"cpu", "memory"} <= requests.keys()
            # Read-only root FS: HOME/TMPDIR must be on a writable emptyDir.
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env.get("HOME") == "/tmp", where
            tmp_mounts = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp_mounts and tmp_mounts[0]["name"] in mounts_tmp, where


def test_operator_probes_and_ports(rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployment = _one(rendered["default"], "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8081, "metrics": 9090}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    args = container["args"]
    assert "--liveness=http://0.0.0.0:8081/healthz" in args
    assert "--metrics-port=9090" in args
    service = next(o for o in rendered["default"] if o["kind"] == "Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # The helm test hook checks the same health endpoint through that Service.
    hook = _one(rendered["default"], "Pod")
    url = hook["spec"]["containers"][0]["command"][-1]
    assert url == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:8081/healthz"


def test_images_follow_values_and_default_to_app_version(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    default = _one(rendered["default"], "Deployment")["spec"]["template"]["spec"]
    assert default["containers"][0]["image"] == (
        f"ghcr.io/packrat-operator/operator:{chart['appVersion']}"
    )
    assert (
        f"--image=ghcr.io/packrat-operator/serving:{chart['appVersion']}"
        in (default["containers"][0]["args"])
    )
    custom = _one(rendered["image"], "Deployment")["spec"]["template"]["spec"]
    assert custom["containers"][0]["image"] == "registry.example.com/ops/packrat:9.9.9"
    assert custom["imagePullSecrets"] == [{"name": "regcred"}]
    assert (
        "--image=registry.example.com/ops/serving@sha256:" + "a" * 64
        in custom["containers"][0]["args"]
    )


# ---------------------------------------------------------------------------- RBAC

NAMESPACED_RESOURCES = {
    ("packrat.dev", "packratmodels"): {"create", "get", "list", "watch", "patch", "delete"},
    ("packrat.dev", "packratmodels/status"): {"patch"},
    ("packrat.dev", "packratpipelines"): {"get", "list", "watch", "patch"},
    ("packrat.dev", "packratpipelines/status"): {"patch"},
    ("packrat.dev", "packratpools"): {"get", "list", "watch", "patch"},
    ("packrat.dev", "packratpools/status"): {"patch"},
    ("", "configmaps"): {"create", "get", "list", "watch", "patch", "delete"},
    ("", "services"): {"create", "get", "list", "watch", "patch", "delete"},
    ("apps", "deployments"): {"create", "get", "list", "watch", "patch", "delete"},
    ("batch", "jobs"): {"create", "list", "watch", "delete"},
    ("", "pods"): {"list", "watch", "delete"},
    ("", "pods/log"): {"get"},
    ("", "events"): {"create"},
    ("", "secrets"): {"get", "create", "patch"},
}
CLUSTER_RESOURCES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("", "namespaces"): {"list", "watch"},
}


def _grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "*" not in rule["apiGroups"] and "resourceNames" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


def test_rbac_cluster_wide_is_exactly_what_the_operator_needs(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["default"]
    assert by_kind(objects, "Role") == [] and by_kind(objects, "RoleBinding") == []
    role = _one(objects, "ClusterRole")
    assert _grants(role) == {**CLUSTER_RESOURCES, **NAMESPACED_RESOURCES}
    binding = _one(objects, "ClusterRoleBinding")
    account = _one(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    deployment = _one(objects, "Deployment")
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"]
        == (account["metadata"]["name"])
    )
    assert "--all-namespaces" in _operator_args(objects)


def test_rbac_namespaced_mode_grants_only_listed_namespaces(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["namespaces"]
    cluster_role = _one(objects, "ClusterRole")
    assert _grants(cluster_role) == CLUSTER_RESOURCES  # nothing namespaced cluster-wide
    roles = by_kind(objects, "Role")
    bindings = by_kind(objects, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["models-a", "models-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["models-a", "models-b"]
    for role in roles:
        assert _grants(role) == NAMESPACED_RESOURCES
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[0]["metadata"]["name"],
        }
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    args = _operator_args(objects)
    assert "--namespace=models-a" in args and "--namespace=models-b" in args
    assert "--all-namespaces" not in args


def test_rbac_peering_rules_only_with_peering(rendered: dict[str, list[dict[str, Any]]]) -> None:
    ha_role = _one(rendered["ha"], "Role")
    peering = {"get", "list", "watch", "patch", "create"}  # create: the operator makes it
    assert _grants(ha_role)[("kopf.dev", "kopfpeerings")] == peering
    cluster = _grants(_one(rendered["ha-cluster"], "ClusterRole"))
    assert cluster[("kopf.dev", "clusterkopfpeerings")] == peering
    assert not any(g == "kopf.dev" for g, _ in _grants(_one(rendered["default"], "ClusterRole")))


# KubeApi method -> RBAC verb; read_log reads the pods/log subresource.
_VERBS = {"get": "get", "list": "list", "create": "create", "patch": "patch", "delete": "delete"}
_API_GROUPS = {
    "packratmodels": "packrat.dev",
    "packratpipelines": "packrat.dev",
    "packratpools": "packrat.dev",
    "secrets": "",
    "configmaps": "",
    "services": "",
    "pods": "",
    "events": "",
    "jobs": "batch",
    "deployments": "apps",
}


def _controller_calls() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every Kubernetes call the controller's code makes."""
    import re

    source = "\n".join(
        p.read_text() for p in (ROOT / "operator" / "packrat" / "controller").rglob("*.py")
    )
    calls = set()
    # the resource is a literal, or a module's PLURAL constant (the custom resources)
    from packrat.controller.pipeline import reconcile as pipeline_reconcile

    plurals = {"PLURAL": pipeline_reconcile.PLURAL}
    for method, literal, constant in re.findall(
        r"kube\.(\w+)\(\s*(?:\"([a-z]+)\"|(PLURAL)\b)", source
    ):
        resource = literal or plurals[constant]
        if method in _VERBS:
            calls.add((_API_GROUPS[resource], resource, _VERBS[method]))
    # api.children.keep(kube, <resource>, ...): the one way a child is kept in shape: a get
    # (unless the caller read it), a create, and a patch when it has a drift or settle step
    for match in re.finditer(r"\bkeep\(\s*[\w.]*kube,\s*\"([a-z]+)\"([^)]*)\)", source):
        resource, rest = match.group(1), match.group(2)
        group = _API_GROUPS[resource]
        calls |= {(group, resource, "get"), (group, resource, "create")}
        if "drift=" in rest or "settle=" in rest:
            calls.add((group, resource, "patch"))
    if "kube.read_log(" in source:
        calls.add(("", "pods/log", "get"))
    status_patch = r"kube\.patch_status\(\s*(?:\"([a-z]+)\"|(PLURAL))"
    for match in re.finditer(status_patch, source):
        resource = match.group(1) or plurals[match.group(2)]
        calls.add(("packrat.dev", f"{resource}/status", "patch"))
    # context.run_pass(kube, config, <resource>, ...): a get of the object and a status patch
    for literal, constant in re.findall(
        r"run_pass\(\s*self\.kube,\s*self\.config,\s*(?:\"([a-z]+)\"|(PLURAL)\b)", source
    ):
        resource = literal or plurals[constant]
        calls.add((_API_GROUPS[resource], resource, "get"))
        calls.add(("packrat.dev", f"{resource}/status", "patch"))
    # kopf itself: watches the resources, patches their annotations/finalizers, posts events.
    for resource in ("packratmodels", "packratpipelines", "packratpools"):
        calls |= {("packrat.dev", resource, v) for v in ("list", "watch", "patch")}
    if "kopf.event(" in source:
        calls.add(("", "events", "create"))
    # the children kopf watches to wake their model's daemon
    from packrat.controller.handlers import CHILD_WATCHES

    for api_version, plural, _ in CHILD_WATCHES:
        group = api_version.rpartition("/")[0]
        calls |= {(group, plural, "list"), (group, plural, "watch")}
    return calls


def test_rbac_covers_every_api_call_of_the_controller(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    calls = _controller_calls()
    assert len(calls) >= 10, "controller API calls not found: did the code layout change?"
    for variation, kind in (("default", "ClusterRole"), ("namespaces", "Role")):
        grants = _grants(by_kind(rendered[variation], kind)[0])
        missing = sorted(c for c in calls if c[2] not in grants.get((c[0], c[1]), set()))
        assert missing == [], f"{variation}: the operator would get 403 Forbidden for {missing}"
        namespaced = {k: v for k, v in grants.items() if k in NAMESPACED_RESOURCES}
        unused = sorted(
            (group, resource, verb)
            for (group, resource), verbs in namespaced.items()
            for verb in verbs
            if (group, resource, verb) not in calls
        )
        assert unused == [], f"{variation}: granted but never called (least privilege): {unused}"


def test_secrets_are_only_read_one_by_name(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # the operator reads a storageUri model's credentialsSecret by name to ask the store for
    # the object's ETag, and creates, reads and patches (rotates) each model's admin token
    # Secret; it never lists, watches or deletes Secrets, and does not patch them when
    # rotation is off
    for objects in rendered.values():
        for role in [*by_kind(objects, "Role"), *by_kind(objects, "ClusterRole")]:
            for (_, resource), verbs in _grants(role).items():
                if resource == "secrets":
                    assert verbs == {"get", "create", "patch"}, verbs
    off = render_objects({"adminToken": {"rotationSeconds": 0}})
    for role in [*by_kind(off, "Role"), *by_kind(off, "ClusterRole")]:
        for (_, resource), verbs in _grants(role).items():
            if resource == "secrets":
                assert verbs == {"get", "create"}, verbs
    assert "--admin-token-rotation-seconds=0" in _operator_args(off)


# ---------------------------------------------------------------------------- chart metadata


def test_app_version_is_the_package_version() -> None:
    from packaging_support import pyproject

    import packrat

    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["appVersion"] == packrat.__version__ == pyproject()["project"]["version"]
    with helm_python.Chart.load(CHART_DIR) as loaded:
        assert loaded.metadata["appVersion"] == packrat.__version__


def test_kube_version_floor_is_the_oldest_validated_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={K8S_VERSIONS[0]}-0"
    with helm_python.Chart.load(CHART_DIR) as loaded:  # `helm install` refuses older clusters
        assert loaded.metadata["kubeVersion"] == chart["kubeVersion"]


def test_default_serving_image_matches_the_operator_default() -> None:
    spec = pytest.importorskip("packrat.controller.core.spec")
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert f"{values['servingImage']['repository']}:{chart['appVersion']}" == spec.DEFAULT_IMAGE


def test_chart_crds_are_byte_identical_to_top_level() -> None:
    sync_crds = load_script("sync_crds")
    top = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert top, "no CRDs in crds/"
    assert sync_crds.drift() == [], "run `make crds-sync`"
    assert sync_crds.drift(target=sync_crds.CRDS_CHART) == [], "run `make crds-sync`"
    assert sync_crds.drift(target=sync_crds.PACKAGE) == [], "run `make crds-sync`"
    for name in top:
        assert (ROOT / "crds" / name).read_bytes() == (CHART_DIR / "crds" / name).read_bytes()
    with helm_python.Chart.load(CHART_DIR) as chart:
        kinds = {yaml.safe_load(c["data"])["spec"]["names"]["kind"] for c in chart.crds}
    assert "PackratModel" in kinds


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_chart_crds_are_valid_kubernetes(version: str) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        crds = [yaml.safe_load(c["data"]) for c in chart.crds]
    assert crds
    for crd in crds:
        kubernetes_validate.validate(crd, version, strict=True)


def test_sync_crds_detects_and_fixes_drift(tmp_path: Path) -> None:
    sync_crds = load_script("sync_crds")
    source, target = tmp_path / "src", tmp_path / "dst"
    source.mkdir()
    target.mkdir()
    (source / "a.yaml").write_bytes(b"kind: A\n")
    (target / "a.yaml").write_bytes(b"kind: A  \n")
    (target / "old.yaml").write_bytes(b"kind: Old\n")
    assert len(sync_crds.drift(source=source, target=target)) == 2
    sync_crds.sync(source=source, target=target)
    assert sync_crds.drift(source=source, target=target) == []
    assert sorted(p.name for p in target.iterdir()) == ["a.yaml"]


def test_notes_explain_next_steps() -> None:
    notes = render_chart({"watchNamespaces": ["models-a"]})["packrat-operator/templates/NOTES.txt"]
    assert "kubectl get prm" in notes and "helm test" in notes
    assert "models-a" in notes and "static CPU manager" in notes


def test_values_are_not_mutated_by_rendering() -> None:
    values = copy.deepcopy(VARIATIONS["ha"])
    render_chart(values)
    assert values == VARIATIONS["ha"]


def test_storage_planner_and_policy_values_reach_the_operator(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Issue 26 items 2, 4 and 7: the chart's values become the flags the operator parses."""
    from packrat.cli import build_parser
    from packrat.cli.fetch import limits_from
    from packrat.cli.operator import _model_policy

    args = build_parser().parse_args(_operator_args(rendered["locked-down"]))
    limits = limits_from(args, timeout_s=1.0)
    assert [str(n) for n in limits.policy.allow] == ["10.96.0.0/12"]
    assert limits.policy.hosts == ("minio.storage.svc", ".models.example.com")
    assert limits.max_bytes == 2147483648 and limits.identity == "metadata"
    assert (args.pipeline_plan_seconds, args.pipeline_plan_memory_mib) == (30.0, 256)
    policy = _model_policy(args)
    assert policy.images == ("registry.example.com/packrat/*",)
    assert policy.service_accounts == ("",)  # []: none allowed
    assert policy.priority_classes == ("serving",) and policy.env_secrets is None
    defaults = build_parser().parse_args(_operator_args(rendered["default"]))
    assert (
        _model_policy(defaults).images is None
        and limits_from(defaults, timeout_s=1).policy.allow == ()
    )
