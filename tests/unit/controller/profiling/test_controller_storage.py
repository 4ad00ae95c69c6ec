"""spec.model.storageUri: validation, the fetch init container, the Secret mount, the key."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import pytest

from packrat.controller.core.context import Config, ModelPass, Pass, Result
from packrat.controller.core.model import model_spec, parse
from packrat.controller.core.spec import validate_spec
from packrat.controller.core.status import ModelStatus
from packrat.controller.core.storage import CREDENTIALS_DIR, VERSION_KEY, StorageLimits
from packrat.controller.profiling import manifests as pm
from packrat.controller.profiling.storage_check import CONDITION, resolve_version, retry_delay
from packrat.controller.serving import manifests as m
from packrat.runtime.egress import EgressPolicy
from packrat.runtime.fetch import FetchError

DIGEST = "sha256:" + "ab" * 32
PLAN = {
    "cpus": 2,
    "batch": 4,
    "label": "2x1t/b2",
    "instances": [{"threads": 1, "batch": 2, "count": 2, "latency_ms": 1.0}],
}


def owner(model: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u1"},
        "spec": {"model": dict(model), "cpus": 2, "batchSize": 4},
    }


S3 = {
    "storageUri": "s3://bucket/models/r.mar",
    "format": "mar",
    "sampleRequest": "eA==",
    "credentialsSecret": {"name": "s3-creds"},
}


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ({**S3, "zoo": "tiny"}, "exactly one of"),
        ({**S3, "storageUri": "ftp://h/x.mar"}, "storageUri must be"),
        ({**S3, "storageUri": "s3://bucket/dir/"}, "must name one file"),
        ({**S3, "storageUri": "s3://bucket"}, "must name one file"),
        ({**S3, "credentialsSecret": "s3-creds"}, "credentialsSecret must be"),
        ({**S3, "credentialsSecret": {"name": "Bad_Name"}}, "credentialsSecret.name must be"),
        ({**S3, "digest": "md5:1234"}, "spec.model.digest must match"),
        ({**S3, "digest": "sha256:" + "AB" * 32}, "spec.model.digest must match"),
        ({"zoo": "tiny", "digest": DIGEST}, "apply only to model.storageUri"),
        ({"storageUri": "pvc://claim/../x.pt", "format": "torchscript"}, "without '..'"),
        (
            {**S3, "storageUri": "pvc://claim/x.mar"},
            "credentialsSecret does not apply to pvc",
        ),
        ({**S3, VERSION_KEY: "e1"}, "observedVersion: unknown field"),
        ({k: v for k, v in S3.items() if k != "format"}, "model.format is required"),
    ],
)
def test_bad_storage_specs_are_refused(model: dict[str, Any], needle: str) -> None:
    errors = validate_spec(owner(model)["spec"], name="m")
    assert any(needle in e for e in errors), errors


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/models/r.mar",
        "gs://bucket/r.mar",
        "https://example.com/m/r.mar",
        "pvc://claim/dir/r.mar",
    ],
)
def test_good_storage_specs_pass(uri: str) -> None:
    model = {**S3, "storageUri": uri, "digest": DIGEST}
    if uri.startswith("pvc://"):
        model.pop("credentialsSecret")
    assert validate_spec(owner(model)["spec"], name="m") == []


def _init(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj["spec"]["template"]["spec"].get("initContainers") or [])


def test_s3_fetch_container_mounts_the_secret_only_into_itself() -> None:
    typed = parse(owner(S3))
    typed = typed.with_spec(model={**S3, VERSION_KEY: "etag-1"})  # as the storage check does
    job = pm.profiling_job(typed)
    dep = m.serving_deployment(typed, slot="a", serving_hash="h", replicas=1)
    for obj, expect_version in ((job, True), (dep, False)):
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
        pod = obj["spec"]["template"]["spec"]
        fetch = next(c for c in pod["initContainers"] if c["name"] == "fetch-model")
        assert fetch["command"][:5] == [
            "packrat",
            "fetch",
            S3["storageUri"],
            "-o",
            m.MODEL_DIR + "/model.mar",
        ]
        assert fetch["command"][5:7] == ["--credentials-dir", CREDENTIALS_DIR]
        assert ("--expect-version" in fetch["command"]) is expect_version
        assert fetch["resources"]["requests"] == fetch["resources"]["limits"]
        secret_volumes = [v for v in pod["volumes"] if "secret" in v and v["name"] != "admin-token"]
        assert secret_volumes == [
            {
                "name": "model-credentials",
                "secret": {"secretName": "s3-creds", "defaultMode": 0o440},
            }
        ]
        # the credentials reach the fetch container only, read-only
        for container in [*pod["initContainers"], *pod["containers"]]:
            mounted = {vm["name"]: vm for vm in container.get("volumeMounts") or []}
            if container["name"] == "fetch-model":
                assert mounted["model-credentials"]["readOnly"] is True
                assert mounted["model"].get("readOnly") is False
            else:
                assert "model-credentials" not in mounted
                if "model" in mounted:
                    assert mounted["model"]["readOnly"] is True


def test_digest_is_verified_and_pvc_is_mounted_not_copied() -> None:
    job = pm.profiling_job(parse(owner({**S3, "digest": DIGEST})))
    fetch = _init(job)[0]
    cmd = fetch["command"]
    assert cmd[cmd.index("--digest") + 1] == DIGEST
    assert "--expect-version" not in fetch["command"]

    pvc = {"storageUri": "pvc://claim/dir/r.pt", "format": "torchscript"}
    dep = m.serving_deployment(parse(owner(pvc)), slot="a", serving_hash="h", replicas=1)
    pod = dep["spec"]["template"]["spec"]
    assert "initContainers" not in pod  # no digest: nothing to run
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "claim", "readOnly": True},
    } in pod["volumes"]
    assert pod["containers"][0]["command"][3] == m.MODEL_DIR + "/dir/r.pt"
    verified = pm.profiling_job(parse(owner({**pvc, "digest": DIGEST})))
    check = _init(verified)[0]
    assert check["command"] == [
        "packrat",
        "fetch",
        "--verify",
        m.MODEL_DIR + "/dir/r.pt",
        "--digest",
        DIGEST,
    ]
    assert check["volumeMounts"][0]["readOnly"] is True


def test_version_and_digest_are_part_of_the_profile_key_and_serving_hash() -> None:
    def keys(model: dict[str, Any]) -> tuple[str, str]:
        plain = {k: v for k, v in model.items() if k != VERSION_KEY}
        typed = model_spec(owner(plain)["spec"], image="i").with_spec(model=model)
        return typed.profile_key, typed.serving_hash(PLAN)

    base = keys({**S3, VERSION_KEY: "e1"})
    changed = keys({**S3, VERSION_KEY: "e2"})
    pinned = keys({**S3, "digest": DIGEST})
    assert base[0] != changed[0] and base[1] != changed[1]
    assert pinned[0] not in (base[0], changed[0])
    assert keys({**S3, VERSION_KEY: "e1"}) == base


# -- the operator's version check ---------------------------------------------------------------
class FakeKube:
    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.gets: list[tuple[str, str]] = []

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets.append((resource, name))
        return copy.deepcopy(self.objects.get((resource, name)))


NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
SECRET = {"data": {"AWS_ACCESS_KEY_ID": "YWtpZA==", "AWS_SECRET_ACCESS_KEY": "c2VjcmV0"}}


def _pass(kube: FakeKube, status: ModelStatus, now: datetime.datetime = NOW) -> ModelPass:
    return Pass(
        kube=kube,  # type: ignore[arg-type]
        config=Config(storage_check_seconds=300),
        obj=owner(S3),
        status=status,
        result=Result(),
        now=now,
    )


def test_version_check_reads_the_secret_and_caches_the_etag() -> None:
    kube = FakeKube({("secrets", "s3-creds"): SECRET})
    asked: list[dict[str, str]] = []

    def version_of(uri: str, creds: Mapping[str, str]) -> str:
        asked.append(dict(creds))
        return "etag-1"

    model = parse(owner(S3), default_image="img")
    status = ModelStatus()
    resolved = resolve_version(_pass(kube, status), model, version_of=version_of)
    assert resolved is not None and resolved.spec["model"][VERSION_KEY] == "etag-1"
    assert asked == [{"AWS_ACCESS_KEY_ID": "akid", "AWS_SECRET_ACCESS_KEY": "secret"}]
    assert resolved.profile_key != model.profile_key
    # within the interval the store is not asked again; after it, it is
    resolve_version(
        _pass(kube, status, NOW + datetime.timedelta(seconds=60)), model, version_of=version_of
    )
    assert len(asked) == 1
    p = _pass(kube, status, NOW + datetime.timedelta(seconds=400))
    resolve_version(p, model, version_of=lambda u, c: "etag-2")
    assert status["storage"]["version"] == "etag-2"
    assert [e[1] for e in p.result.events] == ["ModelChanged"]


@pytest.mark.parametrize(
    ("secrets", "error", "reason"),
    [
        ({}, None, "SecretNotFound"),
        ({("secrets", "s3-creds"): SECRET}, FetchError("AccessDenied", "nope"), "AccessDenied"),
        ({("secrets", "s3-creds"): SECRET}, FetchError("NotFound", "no such object"), "NotFound"),
    ],
)
def test_version_check_failures_set_a_condition_and_a_warning(
    secrets: dict[tuple[str, str], dict[str, Any]], error: FetchError | None, reason: str
) -> None:
    def version_of(uri: str, creds: Mapping[str, str]) -> str:
        assert error is not None
        raise error

    status = ModelStatus()
    p = _pass(FakeKube(secrets), status)
    assert resolve_version(p, parse(owner(S3), default_image="img"), version_of=version_of) is None
    cond = next(c for c in status["conditions"] if c["type"] == CONDITION)
    assert cond["status"] == "False" and cond["reason"] == reason
    assert p.result.events[0][:2] == ("Warning", reason)
    assert p.status.phase == "Failed" and p.result.retry_seconds is not None
    # the same failure on the next pass is not announced again
    p2 = _pass(FakeKube(secrets), status)
    resolve_version(p2, parse(owner(S3), default_image="img"), version_of=version_of)
    assert p2.result.events == []


def test_pinned_digest_never_asks_the_store() -> None:
    kube = FakeKube({})
    model = parse(owner({**S3, "digest": DIGEST}), default_image="img")

    def version_of(uri: str, creds: Mapping[str, str]) -> str:
        raise AssertionError("the store was asked")

    assert resolve_version(_pass(kube, ModelStatus()), model, version_of=version_of) is model
    assert kube.gets == []


def test_a_failed_recheck_keeps_the_known_version_serving() -> None:
    kube = FakeKube({("secrets", "s3-creds"): SECRET})
    model = parse(owner(S3), default_image="img")
    status = ModelStatus()
    resolve_version(_pass(kube, status), model, version_of=lambda u, c: "etag-1")

    def outage(uri: str, creds: Mapping[str, str]) -> str:
        raise FetchError("Unreachable", "connection refused")

    p = _pass(kube, status, NOW + datetime.timedelta(seconds=400))
    kept = resolve_version(p, model, version_of=outage)
    assert kept is not None and kept.spec["model"][VERSION_KEY] == "etag-1"
    assert p.status.phase != "Failed" and p.result.events[0][:2] == ("Warning", "Unreachable")
    cond = next(c for c in status["conditions"] if c["type"] == CONDITION)
    assert cond["status"] == "False" and cond["reason"] == "Unreachable"
    assert not any(c["type"] == "Ready" for c in status["conditions"])
    # soon after, still failing: asked again (not served from the cache as "Found")
    p = _pass(kube, status, NOW + datetime.timedelta(seconds=410))
    resolve_version(p, model, version_of=outage)
    assert next(c for c in status["conditions"] if c["type"] == CONDITION)["status"] == "False"
    # the store answers again with the same ETag: available, nothing re-profiled
    p = _pass(kube, status, NOW + datetime.timedelta(seconds=800))
    again = resolve_version(p, model, version_of=lambda u, c: "etag-1")
    assert again is not None and again.profile_key == kept.profile_key
    assert p.result.events == []


def test_an_outage_is_asked_again_with_backoff_not_every_pass() -> None:
    kube = FakeKube({("secrets", "s3-creds"): SECRET})
    model = parse(owner(S3), default_image="img")
    asked: list[float] = []

    def outage(uri: str, creds: Mapping[str, str]) -> str:
        asked.append(1.0)
        raise FetchError("Unreachable", "connection refused")

    status = ModelStatus()
    t = 0.0
    delays = []
    for _ in range(6):  # passes at the delays the failures ask for, and one in between each
        p = _pass(kube, status, NOW + datetime.timedelta(seconds=t))
        assert resolve_version(p, model, version_of=outage) is None
        assert p.result.retry_seconds is not None
        delays.append(p.result.retry_seconds)
        mid = _pass(kube, status, NOW + datetime.timedelta(seconds=t + p.result.retry_seconds / 2))
        resolve_version(mid, model, version_of=outage)  # a wake-up within the backoff
        assert mid.result.events == []
        t += p.result.retry_seconds
    assert len(asked) == 6  # once per backoff, never in between
    for delay, plain in zip(delays, [2.0, 4.0, 8.0, 16.0, 32.0, 64.0], strict=True):
        assert round(plain * 0.8) <= delay <= plain  # doubling, with jitter
    assert status["storage"]["failures"] == 6
    cond = next(c for c in status["conditions"] if c["type"] == CONDITION)
    assert cond["reason"] == "Unreachable"
    # the cap is the storage check interval
    assert 240 <= retry_delay(20, 300) <= 300


def test_new_credentials_are_tried_at_once_despite_the_backoff() -> None:
    kube = FakeKube({("secrets", "s3-creds"): SECRET})
    model = parse(owner(S3), default_image="img")
    status = ModelStatus()

    def denied(uri: str, creds: Mapping[str, str]) -> str:
        raise FetchError("AccessDenied", "bad key")

    for i in range(4):
        resolve_version(
            _pass(kube, status, NOW + datetime.timedelta(seconds=100 * i)), model, version_of=denied
        )
    fixed = {"data": {**SECRET["data"], "AWS_SECRET_ACCESS_KEY": "Zml4ZWQ="}}
    kube.objects[("secrets", "s3-creds")] = fixed
    p = _pass(kube, status, NOW + datetime.timedelta(seconds=301))  # within the 16 s backoff
    resolved = resolve_version(p, model, version_of=lambda u, c: "etag-9")
    assert resolved is not None and status["storage"]["version"] == "etag-9"
    assert "error" not in status["storage"]


def test_the_operators_egress_policy_and_byte_cap_reach_the_init_container() -> None:
    """Issue 26 item 2: ``packrat fetch`` obeys the operator's policy, and the emptyDir it
    writes into is no larger than the largest model allowed."""
    limits = StorageLimits(
        policy=EgressPolicy.parse(["10.96.0.0/12"], ["minio.storage.svc"]),
        max_model_bytes=1 << 30,
        cloud_identity="metadata",
    )
    typed = parse(owner(S3)).with_spec(model={**S3, VERSION_KEY: "etag-1"})
    job = pm.profiling_job(typed, limits=limits)
    dep = m.serving_deployment(typed, slot="a", serving_hash="h", replicas=1, limits=limits)
    for obj in (job, dep):
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
        pod = obj["spec"]["template"]["spec"]
        fetch = next(c for c in pod["initContainers"] if c["name"] == "fetch-model")
        flags = " ".join(fetch["command"])
        assert "--egress-allow 10.96.0.0/12 --storage-host minio.storage.svc" in flags
        assert "--max-model-bytes 1073741824 --cloud-identity metadata" in flags
        (model,) = [v for v in pod["volumes"] if v["name"] == "model"]
        assert model["emptyDir"] == {"sizeLimit": "1073741824"}
