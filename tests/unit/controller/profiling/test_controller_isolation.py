"""CoresExclusive from the profile's isolation record; allowContended reaches the Job."""

from __future__ import annotations

from typing import Any

from packrat.controller.core.model import model_spec
from packrat.controller.core.spec import validate_spec
from packrat.controller.profiling import manifests as pm
from packrat.controller.profiling.isolation import cores_exclusive
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint

POINT = ProfilePoint(threads=1, batch=1, latency_ms=1.0)


def _profile(isolation: dict[str, Any] | None) -> Profile:
    extra = {"isolation": isolation} if isolation is not None else {}
    return Profile(meta=ProfileMeta(model="m", cpus=2, extra=extra), points=(POINT,))


def test_verified_cores() -> None:
    record = {"exact": True, "quiet": True, "contaminated": False, "cpuset": "2-3"}
    record["spare_share"] = {"2": 0.98, "3": 0.97}
    status, reason, message = cores_exclusive(_profile(record))
    assert (status, reason) == (True, "Verified")
    assert "2-3" in message and "0.97" in message


def test_wide_cpuset_busy_and_contaminated() -> None:
    wide = {"exact": False, "quiet": True, "reasons": ["cpuset 0-7 has 8 cpu(s), 2 requested"]}
    assert cores_exclusive(_profile(wide))[:2] == (False, "CpusetNotExclusive")
    assert "0-7" in cores_exclusive(_profile(wide))[2]
    busy = {"exact": True, "quiet": False, "allow_contended": True, "reasons": ["busy core(s)"]}
    status, reason, message = cores_exclusive(_profile(busy))
    assert (status, reason) == (False, "CoresBusy") and "allowContended" in message
    broken = {"exact": True, "quiet": True, "contaminated": True, "reasons": ["non-monotone"]}
    assert cores_exclusive(_profile(broken))[:2] == (False, "ProfileContaminated")


def test_no_record_is_unknown() -> None:
    assert cores_exclusive(_profile(None))[0] is None


def test_allow_contended_reaches_the_profile_command() -> None:
    spec: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2}
    assert "--allow-contended" not in pm.profile_command(model_spec(spec), output="/p/x")
    allowed = {**spec, "profiling": {"allowContended": True}}
    cmd = pm.profile_command(model_spec(allowed), output="/p/x")
    assert "--allow-contended" in cmd and cmd[-2:] == ["-o", "/p/x"]
    assert validate_spec(allowed) == []
    assert validate_spec({**spec, "profiling": {"allowContended": "yes"}})
