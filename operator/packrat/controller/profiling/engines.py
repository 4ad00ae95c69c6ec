"""What a profile says about its engines, as the EnginesVerified condition (pure).

``packrat profile --engines ...`` records per engine whether it was converted and agreed with
eager (``meta.extra.engines``, see :mod:`packrat.profiler.engines`). An engine left out has
no points, so no plan uses it; the operator says so: EnginesVerified False with each left-out
engine's reason, and a Warning event per engine when the profile is stored. A profile of
eager only has no record and sets no condition.
"""

from __future__ import annotations

from typing import Any

from packrat.plan.profile import ENGINES_KEY, Profile

__all__ = ["CONDITION", "engines_condition", "left_out"]

CONDITION = "EnginesVerified"


def left_out(profile: Profile) -> dict[str, str]:
    """Engine -> why it was left out of the profile."""
    record: Any = profile.meta.extra.get(ENGINES_KEY)
    if not isinstance(record, dict):
        return {}
    return {
        str(name): str(r.get("reason") or "left out")[:300]
        for name, r in sorted(record.items())
        if isinstance(r, dict) and r.get("status") != "ok"
    }


def engines_condition(profile: Profile) -> tuple[bool | None, str, str]:
    """(status, reason, message) of EnginesVerified; status None = no engines recorded."""
    if not isinstance(profile.meta.extra.get(ENGINES_KEY), dict):
        return None, "", ""
    out = left_out(profile)
    if out:
        message = "; ".join(f"{name} left out: {why}" for name, why in out.items())
        return False, "EnginesLeftOut", f"{message} (serving {', '.join(profile.engines)})"
    return True, "Verified", f"engines {', '.join(profile.engines)} agree with eager"
