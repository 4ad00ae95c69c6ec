"""What names a model and what it takes, without importing torch.

The serving pod's dispatcher process needs a model's name, its digest (the shared weight
file is named by it), and for a zoo model its input description (the archive's metadata and
the warm-up body); importing torch for that costs about a second of CPU and 145 MB of
memory on the pod's start path, while the JVM and the zygote compete for the same cores.
This module is the torch-free source of those facts; :mod:`packrat.runtime.zoo` builds its
registry on it (the architectures and the torch dtypes), so the two cannot disagree.
A user's TorchScript file is described by the zoo (reading its description means loading
it, which validates it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SEED",
    "WEIGHTS_SUFFIX",
    "ZOO",
    "ZOO_NAMES",
    "ZooInput",
    "ZooModel",
    "is_zoo_name",
    "model_digest",
    "model_name",
    "unknown_model",
    "weights_file_name",
    "zoo_input_spec",
    "zoo_key",
]

SEED = 0
WEIGHTS_SUFFIX = ".weights.pt"


@dataclass(frozen=True, slots=True)
class ZooInput:
    shape: tuple[int, ...]  # without the batch dimension
    dtype: str  # a torch dtype's name: "float32", "int64"
    high: int = 0  # for integer token ids: values in [0, high)


@dataclass(frozen=True, slots=True)
class ZooModel:
    inputs: tuple[ZooInput, ...]
    # Bump when the architecture or its initialisation changes: it changes model_digest, so
    # profiles measured on the old definition are not reused.
    version: int = 1


ZOO: dict[str, ZooModel] = {
    "resnet50": ZooModel((ZooInput((3, 224, 224), "float32"),)),
    "inception_v3": ZooModel((ZooInput((3, 299, 299), "float32"),)),
    "bert-base": ZooModel((ZooInput((128,), "int64", high=30522),)),
    "gpt2": ZooModel((ZooInput((128,), "int64", high=50257),)),
    "tiny": ZooModel((ZooInput((16,), "float32"),)),
}
ZOO_NAMES: tuple[str, ...] = tuple(ZOO)
_ALIASES = {
    "resnet-50": "resnet50",
    "inception-v3": "inception_v3",
    "inceptionv3": "inception_v3",
    "bert": "bert-base",
    "bert_base": "bert-base",
    "gpt-2": "gpt2",
}


def zoo_key(spec: str) -> str | None:
    """The canonical zoo name ``spec`` refers to, or None for a file."""
    name = spec.strip()
    name = name.removeprefix("zoo:").lower()
    name = _ALIASES.get(name, name)
    return name if name in ZOO else None


def is_zoo_name(spec: str) -> bool:
    return zoo_key(spec) is not None


def model_name(spec: str) -> str:
    """The model's short name: the canonical zoo name, or the file's stem."""
    key = zoo_key(spec)
    return key if key is not None else Path(spec).stem


def unknown_model(spec: str) -> str:
    """The one line for a spec that is neither a zoo name nor a file."""
    return f"unknown model {spec!r}: not a zoo name ({', '.join(ZOO_NAMES)}) and no such file"


def zoo_input_spec(spec: str) -> list[dict[str, Any]] | None:
    """A zoo model's inputs as ``{"shape", "dtype", "high"}`` dicts; None for a file."""
    key = zoo_key(spec)
    if key is None:
        return None
    return [{"shape": list(i.shape), "dtype": i.dtype, "high": i.high} for i in ZOO[key].inputs]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def model_digest(spec: str) -> str | None:
    """A zoo model's stable id (name + architecture version + seed); None for a file
    (:func:`packrat.runtime.zoo.model_digest` hashes it, after checking it exists)."""
    key = zoo_key(spec)
    if key is None:
        return None
    text = f"packrat-zoo/{key}/v{ZOO[key].version}/seed{SEED}"
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def weights_file_name(spec: str, digest: str) -> str:
    """The shared weight file's name: named by the digest, so never stale."""
    return f"{model_name(spec)}-{digest.removeprefix('sha256:')[:16]}{WEIGHTS_SUFFIX}"
