"""A model cut into stages, the unit the GPU tier loads, keeps resident or reads in place.

A stage is a module that maps the previous stage's activation to the next one; running the
stages in order equals the plain model (tested). Its weights are addressed by name so that
each pass can hand the stage a different copy of them (device-resident, freshly copied, or a
device view of mapped host memory), bound into the modules for the call (:meth:`Stage.run`).

A tensor used by several stages (GPT-2's tied ``wte``: the embedding lookup and the head) is
**owned** by the last stage that uses it: that stage's placement decides whether it is copied
or read in place. An earlier stage borrows it: from the device when it is resident there, else
in place from host memory (the embedding lookup reads a few rows: DeepPlan's rule of thumb).

Cuts: ResNet-50 -- the stem, each of the 16 bottlenecks, the head; BERT-base -- the
embeddings, each of the 12 layers, the pooler; GPT-2 -- the embeddings, each of the 12 blocks,
the final norm and tied head; an ``nn.Sequential`` (and the zoo's tiny MLP) -- its children.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from packrat.runtime.zoo.resnet import ResNet50
from packrat.runtime.zoo.tiny import Tiny
from packrat.runtime.zoo.transformer import GPT2, BertBase

__all__ = ["Stage", "StagedModel", "split"]


@dataclass(frozen=True)
class Stage:
    """One stage: its module, the names (in the stage module) of every tensor it reads, mapped
    to the model-wide key of that tensor, and the keys it owns."""

    name: str
    module: nn.Module
    tensors: dict[str, str]  # local name in ``module`` -> global key
    owned: tuple[str, ...]
    # (the submodule's _parameters or _buffers dict, attribute, global key, the original tensor)
    slots: tuple[tuple[dict[str, Any], str, str, Tensor], ...]
    bound: list[dict[str, Tensor] | None] = field(default_factory=lambda: [None], compare=False)
    # stages that bind into some of the same dicts (GPT-2's tied table): binding here makes
    # theirs stale, so they bind again on their next run
    peers: list[Stage] = field(default_factory=list, compare=False, repr=False)

    def bind(self, weights: dict[str, Tensor]) -> None:
        """Put ``weights`` (global key -> tensor) in place of the module's own tensors.

        Not :func:`torch.func.functional_call`: that costs about 100-300 us a call in Python,
        more than a warm stage's kernels at batch 1; binding into the modules' dicts costs well
        under a microsecond a tensor, and nothing when the same weights are bound already (a
        warm model's passes). Stages run one at a time (one compute stream); a stage shared by
        models of one architecture is rebound when another model's weights come.
        """
        if self.bound[0] is weights:
            return
        for table, attr, key, _ in self.slots:
            table[attr] = weights[key]
        self.bound[0] = weights
        for peer in self.peers:
            if peer.bound[0] is not None:
                peer.bound[0] = {}  # stale: not None, so unbind still restores

    def unbind(self) -> None:
        """Put the module's own tensors back, so no module keeps a device buffer alive."""
        if self.bound[0] is None:
            return
        for table, attr, _, original in self.slots:
            table[attr] = original
        self.bound[0] = None

    def run(self, weights: dict[str, Tensor], x: Tensor) -> Tensor:
        self.bind(weights)
        out: Tensor = self.module(x)
        return out


@dataclass(frozen=True)
class StagedModel:
    """The stages in order and every tensor of the model by key (on the CPU, as built)."""

    stages: tuple[Stage, ...]
    tensors: dict[str, Tensor]

    @functools.cached_property
    def owner(self) -> dict[str, int]:
        """Global key -> the index of the stage that owns it."""
        return {k: i for i, s in enumerate(self.stages) for k in s.owned}

    def owned_bytes(self, i: int) -> int:
        return sum(_nbytes(self.tensors[k]) for k in self.stages[i].owned)

    @property
    def total_bytes(self) -> int:
        return sum(_nbytes(t) for t in self.tensors.values())

    def forward(self, x: Tensor) -> Tensor:
        """All stages with the built tensors (the reference the executor is checked against)."""
        for s in self.stages:
            x = s.run(self.tensors, x)
        self.unbind()
        return x

    def unbind(self) -> None:
        for s in self.stages:
            s.unbind()


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class _Fn(nn.Module):
    """A stage built from submodules of the model and a forward function over them."""

    def __init__(self, fn: Callable[[Any, Tensor], Tensor], **parts: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        for name, part in parts.items():
            self.add_module(name, part)

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(self, x)


def _pool(m: Any, x: Tensor) -> Tensor:
    return torch.tanh(m.pooler(x[:, 0]))


def _bert_embed(m: Any, ids: Tensor) -> Tensor:
    pos = torch.arange(ids.shape[1], device=ids.device)
    x = m.word(ids) + m.pos(pos)
    out: Tensor = m.norm(x + m.tt(torch.zeros_like(ids)))
    return out


def _gpt_embed(m: Any, ids: Tensor) -> Tensor:
    pos = torch.arange(ids.shape[1], device=ids.device)
    out: Tensor = m.wte(ids) + m.wpe(pos)
    return out


def _gpt_head(m: Any, x: Tensor) -> Tensor:
    return F.linear(m.ln_f(x[:, -1]), m.wte.weight)


def _resnet_head(m: Any, x: Tensor) -> Tensor:
    out: Tensor = m.fc(torch.flatten(m.avgpool(x), 1))
    return out


def _modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    if isinstance(model, ResNet50):
        stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
        stages_: list[Any] = [model.layer1, model.layer2, model.layer3, model.layer4]
        blocks: list[tuple[str, nn.Module]] = [
            (f"layer{i}.{j}", b) for i, layer in enumerate(stages_, 1) for j, b in enumerate(layer)
        ]
        head = _Fn(_resnet_head, avgpool=model.avgpool, fc=model.fc)
        return [("stem", stem), *blocks, ("head", head)]
    if isinstance(model, BertBase):
        emb = _Fn(
            _bert_embed,
            word=model.word_embeddings,
            pos=model.position_embeddings,
            tt=model.token_type_embeddings,
            norm=model.embed_norm,
        )
        layers = [(f"layer{i}", m) for i, m in enumerate(model.layers)]
        pool = _Fn(_pool, pooler=model.pooler)
        return [("embeddings", emb), *layers, ("pooler", pool)]
    if isinstance(model, GPT2):
        emb = _Fn(_gpt_embed, wte=model.wte, wpe=model.wpe)
        blocks = [(f"block{i}", m) for i, m in enumerate(model.blocks)]
        head = _Fn(_gpt_head, ln_f=model.ln_f, wte=model.wte)
        return [("embeddings", emb), *blocks, ("head", head)]
    if isinstance(model, Tiny):
        model = model.net
    if isinstance(model, nn.Sequential):
        return [(str(i), m) for i, m in enumerate(model)]
    raise ValueError(
        f"no stage cut for {type(model).__name__}: ResNet50, BertBase, GPT2, nn.Sequential"
    )


def split(model: nn.Module) -> StagedModel:
    """Cut ``model`` into stages; each tensor keyed by its storage, owned by its last user."""
    parts = _modules(model)
    keys: dict[int, str] = {}  # id of the tensor object -> global key
    tensors: dict[str, Tensor] = {}
    per_stage: list[dict[str, str]] = []
    per_slots: list[tuple[tuple[dict[str, Any], str, str, Tensor], ...]] = []
    for sname, mod in parts:
        names: dict[str, str] = {}
        slots: list[tuple[dict[str, Any], str, str, Tensor]] = []
        for sub_name, sub in mod.named_modules(remove_duplicate=False):
            for kind in ("_parameters", "_buffers"):
                for attr, t in getattr(sub, kind).items():
                    if t is None:
                        continue
                    local = f"{sub_name}.{attr}" if sub_name else attr
                    key = keys.setdefault(id(t), f"{sname}.{local}")
                    tensors[key] = t.detach()
                    names[local] = key
                    slots.append((getattr(sub, kind), attr, key, t))
        per_stage.append(names)
        per_slots.append(tuple(slots))
    last_user = {k: i for i, names in enumerate(per_stage) for k in names.values()}
    stages = tuple(
        Stage(
            sname,
            mod,
            names,
            tuple(dict.fromkeys(k for k in names.values() if last_user[k] == i)),
            per_slots[i],
        )
        for i, ((sname, mod), names) in enumerate(zip(parts, per_stage, strict=True))
    )
    for a in stages:
        tables = {id(t) for t, *_ in a.slots}
        a.peers.extend(b for b in stages if b is not a and tables & {id(t) for t, *_ in b.slots})
    return StagedModel(stages, tensors)
