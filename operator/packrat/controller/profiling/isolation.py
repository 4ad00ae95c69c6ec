"""What a profile's own isolation check found, as the CoresExclusive condition (pure).

The profiling pod calibrates its cores and checks its cpuset (``packrat profile`` records the
verdict in ``meta.extra.isolation``; see :mod:`packrat.profiler.verify`). The operator turns
that record into ``CoresExclusive`` (True, or False with the reasons) and, when the profile
is stored, a Warning event; a profile without the record (older or imported) gives Unknown.
"""

from __future__ import annotations

from typing import Any

from packrat.plan.profile import Profile

__all__ = ["CONDITION", "cores_exclusive"]

CONDITION = "CoresExclusive"


def cores_exclusive(profile: Profile) -> tuple[bool | None, str, str]:
    """(status, reason, message) of CoresExclusive for ``profile``; status None = unknown."""
    record: Any = profile.meta.extra.get("isolation")
    if not isinstance(record, dict) or "exact" not in record:
        return None, "NotChecked", "the profile does not record an isolation check"
    reasons = [str(r) for r in record.get("reasons") or []]
    if record.get("exact") and record.get("quiet") and not record.get("contaminated"):
        shares = record.get("spare_share") or {}
        low = min(shares.values()) if shares else None
        detail = f"; lowest spare share {low:.2f}" if isinstance(low, float) else ""
        return True, "Verified", f"cpuset {record.get('cpuset')} exact and quiet{detail}"
    if not record.get("exact"):
        reason = "CpusetNotExclusive"
    elif not record.get("quiet"):
        reason = "CoresBusy"
    else:
        reason = "ProfileContaminated"
    allowed = " (stored because allowContended is set)" if record.get("allow_contended") else ""
    return False, reason, ("; ".join(reasons) or reason) + allowed
