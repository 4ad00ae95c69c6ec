"""EnginesVerified: what a profile of several engines says about the ones it left out."""

from __future__ import annotations

from packrat.controller.profiling.engines import engines_condition, left_out
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint


def _profile(engines: dict[str, object] | None) -> Profile:
    extra = {} if engines is None else {"engines": engines}
    points = (ProfilePoint(1, 1, 2.0), ProfilePoint(1, 1, 1.0, engine="openvino"))
    return Profile(meta=ProfileMeta(model="m", cpus=1, extra=extra), points=points)


def test_all_engines_agree() -> None:
    status, reason, message = engines_condition(
        _profile({"eager": {"status": "ok"}, "openvino": {"status": "ok"}})
    )
    assert status is True and reason == "Verified" and "eager, openvino" in message


def test_a_left_out_engine_is_said_with_its_reason() -> None:
    profile = _profile(
        {
            "eager": {"status": "ok"},
            "openvino": {"status": "ok"},
            "onnxruntime": {"status": "excluded", "reason": "differs from eager: batch of 3"},
        }
    )
    status, reason, message = engines_condition(profile)
    assert status is False and reason == "EnginesLeftOut"
    assert "onnxruntime left out: differs from eager: batch of 3" in message
    assert left_out(profile) == {"onnxruntime": "differs from eager: batch of 3"}


def test_an_eager_only_profile_sets_no_condition() -> None:
    assert engines_condition(_profile(None))[0] is None
    assert left_out(_profile(None)) == {}
