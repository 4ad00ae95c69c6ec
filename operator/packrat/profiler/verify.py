"""Verified isolation for a profile run: check the cores, re-measure suspects, give a verdict.

The profiler calls :meth:`Verifier.check` before the first point, every few points and after
the last (a spare-CPU calibration of the profiled cores, see :mod:`packrat.runtime.isolation`),
then :meth:`Verifier.remeasure` on the points :func:`~packrat.profiler.outliers.find_suspects`
flags (keeping the lower mean), and records :meth:`Verifier.verdict` in the profile. A profile
is *contaminated* when a core was busy or throttled, or a monotonicity break survived the
re-measurements; the profiler refuses to store it unless the run allows contention.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packrat.plan.profile import ProfilePoint
from packrat.profiler.outliers import Suspect, better_point, find_suspects
from packrat.runtime.isolation import IsolationReport, check_isolation, merge_reports

__all__ = ["ALLOW_CONTENDED_ENV", "Verifier", "allow_contended_default", "set_aside"]

ALLOW_CONTENDED_ENV = "PACKRAT_ALLOW_CONTENDED"

Key = tuple[int, int]


def allow_contended_default() -> bool:
    """``PACKRAT_ALLOW_CONTENDED=1`` allows contended profiles (shared CI machines)."""
    return os.environ.get(ALLOW_CONTENDED_ENV, "").strip().lower() in ("1", "true", "yes")


@dataclass(slots=True)
class Verifier:
    requested: int
    pool: Sequence[int]  # this process's whole cpuset
    cores: Sequence[int]  # the cores the profile runs on
    calibration_s: float = 0.2
    enabled: bool = True
    reports: list[IsolationReport] = field(default_factory=list)
    remeasured: dict[str, list[float]] = field(default_factory=dict)
    suspects: list[Suspect] = field(default_factory=list)

    def check(self) -> IsolationReport | None:
        if not self.enabled:
            return None
        report = check_isolation(
            self.requested, cpus=self.pool, calibrate=self.cores, seconds=self.calibration_s
        )
        self.reports.append(report)
        return report

    def remeasure(
        self,
        points: dict[Key, ProfilePoint],
        measure: Callable[[Key], ProfilePoint],
        *,
        rounds: int,
    ) -> list[Suspect]:
        """Re-measure suspects up to ``rounds`` times each; returns those that remain."""
        suspects = find_suspects(points)
        for _ in range(rounds):
            if not suspects:
                break
            for suspect in suspects:
                old = points[suspect.key]
                new = measure(suspect.key)
                label = f"t{suspect.key[0]}b{suspect.key[1]}"
                history = self.remeasured.setdefault(label, [round(old.latency_ms, 4)])
                history.append(round(new.latency_ms, 4))
                points[suspect.key] = better_point(old, new)
            suspects = find_suspects(points)
        self.suspects = suspects
        return suspects

    @property
    def isolation(self) -> IsolationReport | None:
        return merge_reports(self.reports) if self.reports else None

    def reasons(self) -> list[str]:
        report = self.isolation
        out = list(report.reasons()) if report is not None else []
        out += [f"{s.rule}: {s.detail}" for s in self.suspects if s.blocking]
        return out

    @property
    def contaminated(self) -> bool:
        report = self.isolation
        busy = report is not None and not report.quiet
        return busy or any(s.blocking for s in self.suspects)

    def finish(
        self,
        points: dict[Key, ProfilePoint],
        measure: Callable[[Key], ProfilePoint],
        *,
        rounds: int,
        allowed: bool,
        show: Callable[[str], None],
    ) -> dict[str, Any]:
        """Re-measure suspects, calibrate the cores once more; the verdict to record."""
        left = self.remeasure(points, measure, rounds=rounds)
        self.check()
        verdict = self.verdict(allowed=allowed)
        for suspect in left:
            show(f"warning: {suspect.rule}: {suspect.detail}")
        if verdict["contaminated"]:
            verb = "allowed" if allowed else "refused"
            show(f"contaminated profile ({verb}): " + "; ".join(verdict["reasons"]))
        return verdict

    def verdict(self, *, allowed: bool) -> dict[str, Any]:
        report = self.isolation
        return {
            **(report.to_dict() if report is not None else {"checks": 0}),
            "calibration_s": self.calibration_s,
            "suspects": [
                {"threads": s.key[0], "batch": s.key[1], "rule": s.rule, "detail": s.detail}
                for s in self.suspects
            ],
            "remeasured": dict(self.remeasured),
            "contaminated": self.contaminated,
            "allow_contended": allowed,
            "reasons": self.reasons(),
        }


def set_aside(path: Path | None) -> Path | None:
    """Move a refused profile out of the way (a rerun must not resume from it)."""
    if path is None or not path.exists():
        return None
    target = path.with_name(path.name + ".contaminated")
    os.replace(path, target)
    return target
