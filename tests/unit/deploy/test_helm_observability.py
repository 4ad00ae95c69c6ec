"""The chart's dashboard and alerts: rendered from the same files the Prometheus test
evaluates, labelled for Grafana's sidecar, and only ever using metrics the code defines.
(Strict lint and schema validation of the rendered chart: the "observability" variation of
test_helm_chart.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging_support import CHART_DIR, ROOT, by_kind, helm_home, load_script, render_objects

pytest.importorskip("helm_python")

DASHBOARD = CHART_DIR / "dashboards" / "packrat.json"
RULES = CHART_DIR / "rules" / "packrat-alerts.yaml"
ENABLED = {
    "dashboards": {"enabled": True, "namespace": "monitoring"},
    "prometheusRule": {"enabled": True, "alertLabels": {"team": "ml", "severity": "page"}},
}


@pytest.fixture(scope="module", autouse=True)
def _helm_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with helm_home(tmp_path_factory.mktemp("helm")):
        yield


def _code_metrics() -> set[str]:
    from packrat.controller.core import metrics
    from packrat.controller.planning import autoscale_metrics  # noqa: F401  (the tuner's)
    from packrat.serve.dispatcher.metrics import ServeMetrics
    from packrat.serve.router import RouterMetrics

    names: set[str] = set()
    for registry in (metrics.REGISTRY, ServeMetrics().registry, RouterMetrics().registry):
        for family in registry.collect():
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_sum", "_count"),
            }.get(family.type, ("",))
            names |= {family.name + s for s in suffixes}
    return names


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(packrat_[a-z0-9_]+)", expr))


def test_dashboard_json_is_generated() -> None:
    gen = load_script("gen_dashboard")
    assert DASHBOARD.read_text(encoding="utf-8") == gen.render(), "run `make dashboards`"


def test_dashboard_has_the_panels_users_ask_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in (
        "request rate",
        "p50 / p99 per model",
        "per plan instance",
        "measured vs expected",
        "queue depth",
        "shed",
        "batch size",
        "switches",
        "switch duration",
        "profiling progress",
        "cores exclusive",
        "arrival envelope vs capacity",
        "replicas and decisions",
        "pipeline queries",
        "pipeline latency",
        "stage latency",
        "stage failures",
    ):
        assert wanted in titles, wanted
    rows = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert rows >= {"Serving", "Load", "Operator", "Tuner", "Pipelines"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "model", "pipeline"}


def _pod_metrics() -> set[str]:
    from packrat.serve.dispatcher.metrics import ServeMetrics

    return {f.name for f in ServeMetrics().registry.collect()}


def test_pod_series_are_joined_on_packratmodel() -> None:
    """A serving pod's `model` label is the served model's name (spec.model.name when set);
    the PackratModel is `packratmodel`. Every dashboard query and alert that reads a pod metric
    selects and groups it by `packratmodel`, never `model` (which breaks those joins)."""
    gen = load_script("gen_dashboard")
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    exprs = [e for _, e in gen.queries(dashboard)]
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    pods = _pod_metrics()
    checked = 0
    for expr in exprs:
        for match in re.finditer(r"\b(by|without)\s*\(([^)]*)\)\s*\(", expr):
            # the aggregation's argument, up to its matching parenthesis
            depth, i = 1, match.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(expr[i], 0)
                i += 1
            inner = expr[match.end() : i - 1]
            names = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in _metric_names(inner)}
            relabelled = '"model", "$1", "packratmodel"' in inner  # model := packratmodel
            if names and names <= pods and not relabelled:
                grouping = {g.strip() for g in match.group(2).split(",")}
                assert "model" not in grouping, (expr, match.group(0))
                checked += 1
        for selector in re.findall(r"(packrat_[a-z_]+)\{([^}]*)\}", expr):
            name = re.sub(r"_(bucket|sum|count|total)$", "", selector[0])
            if name in pods:
                assert not re.search(r"(?<!packrat)model=~", selector[1]), expr
    assert checked >= 15


def test_serving_alerts_name_the_packratmodel() -> None:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    for name in ("PackratInstancesDown", "PackratShedRatioHigh", "PackratLatencyAboveExpected"):
        expr = alerts[name]["expr"]
        assert "label_replace(" in expr and '"model", "$1", "packratmodel"' in expr, name
        assert "by (namespace, model" in expr  # the alert's model label: the PackratModel


def test_every_query_uses_real_metrics() -> None:
    gen = load_script("gen_dashboard")
    known = _code_metrics()
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    exprs = [e for _, e in gen.queries(dashboard)]
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for expr in exprs:
        names = _metric_names(expr)
        assert names and names <= known, (expr, names - known)
    # the legacy label is gone from every query
    assert not [e for e in exprs if re.search(r"\binstance\b", e)]


def test_alerts_cover_the_failure_modes() -> None:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert set(alerts) == {
        "PackratInstancesDown",
        "PackratShedRatioHigh",
        "PackratLatencyAboveExpected",
        "PackratSwitchAborted",
        "PackratProfilingFailed",
        "PackratCoresNotExclusive",
    }
    for alert in alerts.values():
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert "{{ $labels.model }}" in alert["annotations"]["summary"]
        assert "model" in alert["expr"] or "by (namespace, model" in alert["expr"]


def test_disabled_by_default() -> None:
    kinds = {o["kind"] for o in render_objects({})}
    assert "PrometheusRule" not in kinds
    assert not [o for o in by_kind(render_objects({}), "ConfigMap") if "dashboard" in str(o)]


def test_dashboard_configmap_for_the_grafana_sidecar() -> None:
    objects = render_objects(ENABLED)
    (cm,) = [
        o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    (key,) = cm["data"]
    assert key.endswith(".json")
    assert json.loads(cm["data"][key]) == json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for version in ("1.30.0", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(cm, version, strict=True)
    assert len(json.dumps(cm)) < 1_000_000  # a ConfigMap's size limit


def test_prometheus_rule_is_the_rules_file(tmp_path: Path) -> None:
    (rule,) = by_kind(render_objects(ENABLED), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule["spec"]) == {"groups"}
    source = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    rendered: list[dict[str, Any]] = rule["spec"]["groups"]
    assert [g["name"] for g in rendered] == [g["name"] for g in source]
    for got_group, want_group in zip(rendered, source, strict=True):
        for got, want in zip(got_group["rules"], want_group["rules"], strict=True):
            # Prometheus templates survive Helm untouched; extra labels are added, an alert's
            # own labels win
            assert got["expr"] == want["expr"] and got["annotations"] == want["annotations"]
            assert got["labels"] == {"team": "ml", **want["labels"]}
            assert got.get("for") == want.get("for")


def _promtool() -> str | None:
    local = ROOT / ".venv" / "prometheus" / "bin" / "promtool"
    return str(local) if local.is_file() else shutil.which("promtool")


def test_rendered_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    """What Prometheus loads from the rendered PrometheusRule (its spec is a rules file) is
    valid for promtool: it parses, every expression is valid PromQL, no duplicate rules."""
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool not installed: run `make prometheus-tools`")
    (rule,) = by_kind(render_objects(ENABLED), "PrometheusRule")

    def check(name: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / name).write_text(yaml.safe_dump(rule["spec"]))
        return subprocess.run(
            [promtool, "check", "rules", str(tmp_path / name)],
            capture_output=True,
            text=True,
            check=False,
        )

    out = check("rendered.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout + out.stderr
    # and promtool does reject a broken expression
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum by (model (packrat_instance_up)"
    assert check("broken.yaml").returncode != 0


def test_notes_only_use_files_they_create() -> None:
    from packaging_support import render_chart

    notes = render_chart(ENABLED)["packrat-operator/templates/NOTES.txt"]
    for name in re.findall(r"@(\S+)", notes):
        assert f"> {name}" in notes, f"NOTES.txt sends {name} but never creates it"
    assert "grafana_dashboard" in notes and "PrometheusRule" in notes
    assert "packrat-crds" in notes


def test_readme_commands_run_from_a_clone() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    paths = re.findall(r"--profile (\S+\.(?:csv|json))", text)
    assert paths
    for path in paths:
        if path in {"profile.json"}:  # written by the `packrat profile` line before it
            continue
        assert not path.startswith(".."), path
        assert (ROOT / path).is_file(), path
    for needle in ("```mermaid", "KServe", "Seldon", "Triton", "limited maintenance"):
        assert needle in text, needle


def _field_paths(node: dict[str, Any], prefix: str) -> set[str]:
    """Every dotted field path under ``node`` of the CRD's schema (``spec.profiling.threads``)."""
    paths = {prefix}
    for name, child in (node.get("properties") or {}).items():
        paths |= _field_paths(child, f"{prefix}.{name}")
    if isinstance(node.get("items"), dict):
        paths |= _field_paths(node["items"], prefix)
    return paths


def _operator_flags() -> set[str]:
    import argparse

    from packrat.cli import operator

    parser = argparse.ArgumentParser()
    operator.register(parser.add_subparsers())
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {flag for action in sub.choices["operator"]._actions for flag in action.option_strings}


def _alert_texts() -> list[tuple[str, str]]:
    """(alert, text) of every annotation of the rules file and of its promtool unit tests."""
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    texts = [
        (r["alert"], text)
        for g in rules["groups"]
        for r in g["rules"]
        for text in r["annotations"].values()
    ]
    tests = yaml.safe_load((RULES.parent / "packrat-alerts.test.yaml").read_text(encoding="utf-8"))
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            for alert in check.get("exp_alerts", []):
                texts += [
                    (check["alertname"], t) for t in alert.get("exp_annotations", {}).values()
                ]
    return texts


def _unknown_references(text: str, fields: set[str], flags: set[str]) -> list[str]:
    found = [p for p in re.findall(r"\b((?:spec|status)(?:\.[A-Za-z]+)+)", text) if p not in fields]
    found += [f for f in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text) if f not in flags]
    return found


def test_alert_texts_name_real_fields_and_flags() -> None:
    """What an alert tells the person paged (a status field to read, a spec field or operator
    flag to change) exists: every spec./status. path is a field of the PackratModel CRD, every
    --flag one of `packrat operator`'s."""
    from packaging_support import crd_schema

    schema = crd_schema()
    fields = _field_paths(schema["properties"]["spec"], "spec")
    fields |= _field_paths(schema["properties"]["status"], "status")
    flags = _operator_flags()
    texts = _alert_texts()
    named = [t for _, t in texts if re.search(r"\b(spec|status)\.|--[a-z]", t)]
    assert len(named) >= 4, "no alert names a field or flag: did the texts move?"
    bad = {alert: refs for alert, t in texts if (refs := _unknown_references(t, fields, flags))}
    assert bad == {}
    # the check is not vacuous: the texts the alert had before (issue 28 item 3) fail it
    old = "status.profiling.lastFailure says why; it retries --max-profile-retries times"
    assert _unknown_references(old, fields, flags) == [
        "status.profiling.lastFailure",
        "--max-profile-retries",
    ]
    profiling = " ".join(t for a, t in texts if a == "PackratProfilingFailed")
    assert "status.profile.lastFailure" in profiling and "--max-profile-attempts" in profiling
