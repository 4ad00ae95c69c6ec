"""The pod's one weight file: where it lives and how it is made, outside the dispatcher.

The dispatcher process never builds the model, nor imports torch for a zoo model: the file
is named by the model digest (:mod:`packrat.runtime.modelid`, torch-free), so a restarted
pod with the same work directory reuses it, and it is written while TorchServe's JVM comes
up, by the zygote (:mod:`packrat.serve.zygote.zygote`, which has imported torch anyway) or, without
one, by a short-lived ``python -m packrat.runtime.weights`` child. A user's ``.mar`` is
loaded by its own handler and gets no shared file.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from packrat.runtime import modelid
from packrat.serve.torchserve.archive import is_mar

SUBDIR = "weights"


class SharedWeightsError(RuntimeError):
    """The weight file could not be written."""


def shared_weights_file(model: str, workdir: Path, *, enabled: bool = True) -> Path | None:
    """The file every instance of this pod maps, or None when weights stay private."""
    if not enabled or is_mar(model):
        return None
    digest = modelid.model_digest(model)
    if digest is None:
        path = Path(model).expanduser()
        if path.is_file():
            digest = modelid.file_digest(path)
        else:  # the zoo's own error for a missing file or an unknown name
            from packrat.runtime import zoo

            digest = zoo.model_digest(model)
    return workdir / SUBDIR / modelid.weights_file_name(model, digest)


async def ensure_weights(model: str, path: Path, *, timeout_s: float = 600.0) -> Path:
    """Write ``path`` in a child process unless it is already there."""
    if path.is_file():
        return path
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "packrat.runtime.weights",
        model,
        str(path),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SharedWeightsError(f"writing {path.name} took over {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        text = err.decode(errors="replace").strip()
        raise SharedWeightsError(f"writing {path.name} failed ({proc.returncode}): {text}")
    return path
