"""Issue 38: the allow-lists cover spec.pod.imagePullSecrets too, and the defaults refuse what
no model needs: Kubernetes' own system-* priority classes (a model that could take them
preempts the cluster's critical pods). Everything else stays unrestricted unless the platform
sets a list, so existing models keep working (docs/security.md)."""

from __future__ import annotations

from typing import Any

import pytest

from packrat.cli import main
from packrat.controller.core.overrides import ModelPolicy, refused_by_policy

SPEC: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4}


def _why(pod: dict[str, Any], policy: ModelPolicy) -> list[str]:
    return refused_by_policy({**SPEC, "pod": pod}, policy, default_image="img")


@pytest.mark.parametrize("name", ["system-node-critical", "system-cluster-critical"])
def test_system_priority_classes_are_refused_by_default(name: str) -> None:
    assert any("priorityClassName" in w for w in _why({"priorityClassName": name}, ModelPolicy()))
    # unless the platform allows one by name
    allowed = ModelPolicy.parse(priority_classes=[name])
    assert _why({"priorityClassName": name}, allowed) == []


def test_other_fields_stay_unrestricted_by_default() -> None:
    pod = {
        "priorityClassName": "serving",
        "serviceAccountName": "runner",
        "imagePullSecrets": [{"name": "regcred"}],
    }
    assert _why(pod, ModelPolicy()) == []


def test_image_pull_secrets_have_an_allow_list() -> None:
    policy = ModelPolicy.parse(image_pull_secrets=["regcred"])
    assert _why({"imagePullSecrets": [{"name": "regcred"}]}, policy) == []
    why = _why({"imagePullSecrets": [{"name": "regcred"}, {"name": "ci-push"}]}, policy)
    assert len(why) == 1 and "ci-push" in why[0] and "imagePullSecrets" in why[0]


def test_the_flag_sets_it(capsys: pytest.CaptureFixture[str]) -> None:
    from packrat.cli.operator import _model_policy

    parser_args = ["operator", "--allow-image-pull-secret", "regcred", "--help"]
    with pytest.raises(SystemExit):
        main(parser_args)
    assert "--allow-image-pull-secret" in capsys.readouterr().out

    class Args:
        allow_image = allow_service_account = allow_priority_class = allow_env_secret = None
        allow_image_pull_secret = ["regcred"]

    assert _model_policy(Args()).image_pull_secrets == ("regcred",)
