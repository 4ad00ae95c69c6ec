"""The profile file a run resumes from: the same model, T, CPU and measurement mode, or none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packrat.plan.profile import Profile, ProfileError, ProfileMeta, load_profile
from packrat.profiler.errors import ProfilerError

__all__ = ["existing_profile"]


def existing_profile(
    path: Path, meta: ProfileMeta, through: dict[str, Any] | None = None
) -> Profile | None:
    """The profile already at ``path`` if it is for the same model, T, CPU and mode; else
    refuse."""
    if not path.exists():
        return None
    try:
        old = load_profile(path)
    except ProfileError as exc:
        raise ProfilerError(
            f"{path} exists but is not a readable profile ({exc}); move it away or choose "
            f"another -o"
        ) from None
    mismatches = [
        f"{name} {got!r} (this run: {want!r})"
        for name, got, want in (
            ("model digest", old.meta.model_digest, meta.model_digest),
            ("cpus", old.meta.cpus, meta.cpus),
            ("cpu model", old.meta.cpu_model, meta.cpu_model),
            ("mode", old.meta.mode, meta.mode),
            *(
                (key, old.meta.extra.get(key, "model" if key == "through" else None), want)
                for key, want in (through or {}).items()
                if key != "sample_content_type"
            ),
        )
        if got != want
    ]
    if mismatches:
        raise ProfilerError(
            f"{path} holds a profile of {old.meta.model!r} with "
            + ", ".join(mismatches)
            + "; refusing to mix measurements: choose another -o or delete the file"
        )
    return old
