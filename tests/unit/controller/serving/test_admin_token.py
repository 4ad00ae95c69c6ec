"""The admin token's rotation: the decision as a pure function of the Secret and the clock, the
pods accepting the current and the previous token, the operator never calling with a token no
pod accepts whatever the kubelet's delay, and a pass rotating only a Secret it owns, once."""

from __future__ import annotations

import base64
import datetime
import tempfile
from pathlib import Path
from typing import Any

from dispatcher_support import all_up, run, stack
from hypothesis import given, settings
from hypothesis import strategies as st
from kube_support import ADMIN_TOKEN, NS, T0, FakeKube, admin_secret, profile_json, setup_model

from packrat.controller.model.reconcile import Config, Reconciler
from packrat.controller.serving import admin_token as at
from packrat.serve.auth import TokenFile, bearer_accepted

OWNER = {"metadata": {"name": "tiny", "namespace": NS, "uid": "u1"}}
S = datetime.timedelta(seconds=1)


def _rotated(secret: dict[str, Any], token: str, now: datetime.datetime) -> dict[str, Any]:
    """The Secret after a rotation patch (a merge patch: null removes a key)."""
    patch = at.rotation_patch(secret, token=token, now=now)
    data = {k: v for k, v in {**secret["data"], **patch["data"]}.items() if v is not None}
    annotations = {**secret["metadata"].get("annotations", {}), **patch["metadata"]["annotations"]}
    return {**secret, "metadata": {**secret["metadata"], "annotations": annotations}, "data": data}


def test_rotation_due_is_a_function_of_the_annotation_and_the_clock() -> None:
    secret = at.admin_token_secret(OWNER, token="a" * 20, now=T0)
    assert secret["metadata"]["annotations"] == {at.ANNOTATION_ROTATED: "2026-01-01T00:00:00Z"}
    assert at.rotation_due(secret, T0 + 3600 * S, 0) is None  # off
    assert at.rotation_due(secret, T0 + 100 * S, 600) == 500
    assert at.rotation_due(secret, T0 + 600 * S, 600) == 0
    assert at.rotation_due(secret, T0 + 700 * S, 600) == -100
    for junk in ({}, {at.ANNOTATION_ROTATED: "yesterday"}, {at.ANNOTATION_ROTATED: 5}):
        stale = {**secret, "metadata": {**secret["metadata"], "annotations": junk}}
        assert at.rotation_due(stale, T0, 600) == 0  # no readable time: due now


def test_a_rotation_keeps_the_old_token_as_previous_and_carries_the_version() -> None:
    secret = at.admin_token_secret(OWNER, token="a" * 20, now=T0)
    secret["metadata"]["resourceVersion"] = "41"
    patch = at.rotation_patch(secret, token="b" * 20, now=T0 + 700 * S)
    assert patch["metadata"]["resourceVersion"] == "41"  # a 409 if it changed since read
    after = _rotated(secret, "b" * 20, T0 + 700 * S)
    assert at.secret_token(after) == "b" * 20
    assert base64.b64decode(after["data"]["previous"]).decode() == "a" * 20
    # just after: the previous token (every pod holds it), after the window: the new one
    assert at.token_for_calls(after, T0 + 700 * S) == "a" * 20
    assert at.token_for_calls(after, T0 + (700 + at.PROPAGATION_SECONDS - 1) * S) == "a" * 20
    assert at.token_for_calls(after, T0 + (700 + at.PROPAGATION_SECONDS) * S) == "b" * 20
    assert at.token_for_calls(secret, T0) == "a" * 20  # never rotated


def test_the_schedule_is_off_or_longer_than_the_propagation_window() -> None:
    assert at.check_rotation_seconds(0) is None and at.check_rotation_seconds(86400) is None
    assert at.check_rotation_seconds(at.MIN_ROTATION_SECONDS) is None
    assert at.check_rotation_seconds(60) is not None and at.check_rotation_seconds(-1) is not None
    assert at.check_rotation_seconds(float("inf")) is not None


def _mount(directory: Path, secret: dict[str, Any]) -> TokenFile:
    """The Secret as the kubelet mounts it: one file per key."""
    for name in ("token", "previous"):
        path = directory / name
        raw = secret["data"].get(name)
        if raw is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(base64.b64decode(raw))
    return TokenFile(directory / "token")


@settings(max_examples=60, deadline=None)
@given(
    period=st.floats(at.MIN_ROTATION_SECONDS, 4 * at.MIN_ROTATION_SECONDS),
    rotations=st.integers(1, 4),
    lag=st.floats(0, at.PROPAGATION_SECONDS - 1),
    since=st.floats(0, 1.0),
)
def test_the_operator_never_calls_with_a_token_a_pod_does_not_accept(
    period: float, rotations: int, lag: float, since: float
) -> None:
    """Rotations every ``period``; a pod sees the Secret as it was ``lag`` seconds ago (the
    kubelet's delay, up to the propagation window); the operator calls, at any moment, with
    a token that pod's files accept."""
    history = [(T0, at.admin_token_secret(OWNER, token="t0".ljust(20, "x"), now=T0))]
    for k in range(1, rotations + 1):
        when = T0 + k * period * S
        history.append((when, _rotated(history[-1][1], f"t{k}".ljust(20, "x"), when)))
    now = history[-1][0] + since * period * S  # anywhere until the next rotation

    def as_of(t: datetime.datetime) -> dict[str, Any]:
        return [secret for when, secret in history if when <= t][-1]

    token = at.token_for_calls(as_of(now), now)
    assert token is not None
    with tempfile.TemporaryDirectory() as tmp:
        pod = _mount(Path(tmp), as_of(now - lag * S))
        assert bearer_accepted(f"Bearer {token}", pod), (token, pod.accepted())


def test_a_pod_accepts_the_current_and_the_previous_token_and_nothing_else(
    tmp_path: Path,
) -> None:
    (tmp_path / "token").write_text("current-token-0123456789")
    tokens = TokenFile(tmp_path / "token")
    assert tokens.accepted() == ("current-token-0123456789",)
    (tmp_path / "previous").write_text("previous-token-0123456789\n")
    assert tokens.accepted() == ("current-token-0123456789", "previous-token-0123456789")

    async def body() -> None:
        async with stack([1], admin_token=tokens) as (d, _fake, url, s):
            all_up(d)
            for token, status in (
                ("current-token-0123456789", 200),
                ("previous-token-0123456789", 200),
                ("older-token-0123456789", 401),
                ("", 401),
            ):
                headers = {"Authorization": f"Bearer {token}"}
                async with s.get(f"{url}/arrivals", headers=headers) as r:
                    assert r.status == status, token

    run(body)
    (tmp_path / "token").unlink()  # no current token: the previous one is not enough
    assert tokens.accepted() == () and not bearer_accepted(
        "Bearer previous-token-0123456789", tokens
    )


def _rotating(every: float, *, squat: dict[str, Any] | None = None) -> tuple[FakeKube, Reconciler]:
    """A model served from T0 (its token Secret made then, or ``squat`` there before)."""
    kube, _ = setup_model()
    if squat is not None:
        kube.create("secrets", NS, squat)
    config = Config(image="img", profile_retry_seconds=10, admin_token_rotation_seconds=every)
    rec = Reconciler(kube, config=config)
    rec.reconcile(NS, "tiny", now=T0)
    kube.finish_job(ok=True, log=profile_json())
    rec.reconcile(NS, "tiny", now=T0)
    return kube, rec


def _secret(kube: FakeKube) -> dict[str, Any]:
    secret = kube.get("secrets", NS, "tiny-admin-token")
    assert secret is not None
    return secret


def test_a_pass_rotates_an_owned_secret_when_due_once() -> None:
    kube, rec = _rotating(600)
    res = rec.reconcile(NS, "tiny", now=T0 + S)
    first = at.secret_token(_secret(kube))
    assert first is not None and "previous" not in _secret(kube)["data"]
    assert res.retry_seconds is not None and res.retry_seconds <= 600  # a pass by the due time
    res = rec.reconcile(NS, "tiny", now=T0 + 601 * S)
    secret = _secret(kube)
    assert at.secret_token(secret) not in (None, first)
    assert base64.b64decode(secret["data"]["previous"]).decode() == first
    assert at.rotated_at(secret) == T0 + 601 * S
    assert ("Normal", "AdminTokenRotated") in [(k, r) for k, r, _ in res.events]
    rec.reconcile(NS, "tiny", now=T0 + 602 * S)  # level-triggered: not due again
    assert _secret(kube) == secret


def test_no_rotation_when_off_and_never_of_a_secret_not_ours() -> None:
    kube, rec = _rotating(0)
    before = _secret(kube)
    rec.reconcile(NS, "tiny", now=T0 + 10**6 * S)
    assert _secret(kube) == before
    squatted = {"metadata": {"name": "tiny-admin-token"}, "data": {"token": "c3F1YXR0ZWQ="}}
    kube, rec = _rotating(600, squat=squatted)
    rec.reconcile(NS, "tiny", now=T0 + 10**6 * S)
    assert _secret(kube)["data"] == squatted["data"]
    assert not [p for p in kube.patches if p[0] == "secrets"]


def test_read_token_is_the_models_own(kube: FakeKube) -> None:
    assert at.read_token(kube, NS, "m") is None
    admin_secret(kube, "m")
    assert at.read_token(kube, NS, "m", T0) == ADMIN_TOKEN
    assert at.read_token(kube, NS, "other", T0) is None


def test_a_secret_without_a_rotation_time_is_stamped_not_rotated() -> None:
    """A Secret made by an older operator: its pods may read no ``previous`` file, so the
    first pass records the time and the token rotates a full period later."""
    kube, rec = _rotating(600)
    kube.patch("secrets", NS, "tiny-admin-token", {"metadata": {"annotations": None}})
    token = at.secret_token(_secret(kube))
    rec.reconcile(NS, "tiny", now=T0 + 10 * S)
    assert at.secret_token(_secret(kube)) == token and at.rotated_at(_secret(kube)) == T0 + 10 * S
    rec.reconcile(NS, "tiny", now=T0 + 611 * S)
    assert at.secret_token(_secret(kube)) != token


def _with(
    secret: dict[str, Any], *, data: dict[str, str] | None = None, at_: str | None = None
) -> dict[str, Any]:
    meta = dict(secret["metadata"])
    if at_ is not None:
        meta["annotations"] = {at.ANNOTATION_ROTATED: at_}
    return {**secret, "metadata": meta, "data": data if data is not None else secret["data"]}


def test_a_token_written_by_hand_with_a_newline_is_sent_as_the_pods_read_it() -> None:
    # `kubectl create secret generic --from-file=token=f` keeps the file's trailing newline;
    # the pods strip it (TokenFile), so the operator must send the stripped token
    secret = at.admin_token_secret(OWNER, token="a" * 20, now=T0)
    edited = _with(secret, data={"token": base64.b64encode(b"b" * 20 + b"\n").decode()})
    assert at.secret_token(edited) == "b" * 20
    assert at.token_for_calls(edited, T0) == "b" * 20


def test_a_rotation_time_in_the_future_is_stamped_now_not_trusted() -> None:
    # an annotation edited by hand (or a clock far ahead) must not put off rotation for years
    secret = _with(at.admin_token_secret(OWNER, token="a" * 20, now=T0), at_="2099-01-01T00:00:00Z")
    assert at.rotation_due(secret, T0, 600) == 0
    near = _with(secret, at_=at.now_iso(T0 + 30 * S))  # another replica's clock a little ahead
    assert at.rotation_due(near, T0, 600) == 630
    kube, reconciler = _rotating(600)
    token = at.secret_token(_secret(kube))
    kube.patch(
        "secrets",
        NS,
        "tiny-admin-token",
        {"metadata": {"annotations": {at.ANNOTATION_ROTATED: "2099-01-01T00:00:00Z"}}},
    )
    reconciler.reconcile(NS, "tiny", now=T0 + 100 * S)
    assert at.rotated_at(_secret(kube)) == T0 + 100 * S  # stamped, token unchanged
    assert at.secret_token(_secret(kube)) == token


def test_an_owned_secret_left_without_a_token_gets_one_rotation_on_or_off() -> None:
    # a token key deleted or mangled by hand: every pod answers 401 until the Secret holds one
    for every in (0, 600):
        kube, rec = _rotating(every)
        kube.patch("secrets", NS, "tiny-admin-token", {"data": {"token": "bm90IGEgdG9rZW4="}})
        res = rec.reconcile(NS, "tiny", now=T0 + 10 * S)
        assert at.secret_token(_secret(kube)) is not None
        assert "previous" not in _secret(kube)["data"]  # the junk is no previous token
        assert ("Normal", "AdminTokenRotated") in [(k, r) for k, r, _ in res.events]
