"""The built-in model zoo, and loading a user's TorchScript file, behind one ``spec`` string.

Packrat's decisions depend on latency, not on accuracy, so the zoo defines each model's
architecture faithfully (same layers, shapes and parameter counts as the reference
implementations) with random weights from a fixed seed: no downloads, no torchvision (its
PyPI wheels do not import beside the CPU torch build), identical models on every machine.

A ``spec`` is a zoo name (``resnet50``, ``inception_v3``, ``bert-base``, ``gpt2``, ``tiny``,
optionally prefixed ``zoo:``) or a path to a TorchScript file (``.pt``/``.pth``/``.ts``).
A TorchScript file describes its input in an extra file ``packrat.json`` written by
:func:`save_torchscript` (``{"inputs": [{"shape": [3, 224, 224], "dtype": "float32"}]}``,
shapes without the batch dimension).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

__all__ = [
    "ZOO_NAMES",
    "ZooError",
    "example_input",
    "input_spec",
    "is_zoo_name",
    "load_model",
    "model_digest",
    "model_name",
    "save_torchscript",
    "tiny",
]

SEED = 0
EXTRA_FILE = "packrat.json"


class ZooError(ValueError):
    """Unknown zoo name, unreadable model file or missing input description."""


# -- tiny: for tests --------------------------------------------------------------------------
class Tiny(nn.Module):
    """A three-layer MLP, (B, 16) -> (B, 4): fast enough for tests, real enough to pin."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)
        )

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)
        return out


def tiny() -> nn.Module:
    """The tiny test model, built with the zoo's seed, in eval mode."""
    return _seeded(Tiny)


# -- ResNet-50 (He et al. 2016; torchvision's "v1.5": stride on the 3x3 conv) -----------------
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        width = planes
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        out: Tensor = self.relu(y + identity)
        return out


class ResNet50(nn.Module):
    """(B, 3, 224, 224) -> (B, 1000); 25.56M parameters."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        stages: list[nn.Module] = []
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layers: list[nn.Module] = []
            for i in range(blocks):
                layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
                inplanes = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        out: Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return out


# -- Inception v3 (Szegedy et al. 2016; torchvision's layout, auxiliary head included) --------
class BasicConv2d(nn.Module):
    def __init__(self, cin: int, cout: int, **kwargs: Any) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(cin, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([b3, bd, bp], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        for layer in (
            self.branch7x7dbl_2,
            self.branch7x7dbl_3,
            self.branch7x7dbl_4,
            self.branch7x7dbl_5,
        ):
            bd = layer(bd)
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b7, bd, bp], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_1(x)
        for layer in (self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4):
            b7 = layer(b7)
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([b3, b7, bp], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(cin, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b3, bd, bp], 1)


class InceptionAux(nn.Module):
    """The auxiliary classifier: part of the parameters, used only in training."""

    def __init__(self, cin: int, num_classes: int) -> None:
        super().__init__()
        self.conv0 = BasicConv2d(cin, 128, kernel_size=1)
        self.conv1 = BasicConv2d(128, 768, kernel_size=5)
        self.fc = nn.Linear(768, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(self.conv0(F.avg_pool2d(x, kernel_size=5, stride=3)))
        out: Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))
        return out


class InceptionV3(nn.Module):
    """(B, 3, 299, 299) -> (B, 1000); 27.16M parameters (23.8M without the aux head)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, c7=128)
        self.Mixed_6c = InceptionC(768, c7=160)
        self.Mixed_6d = InceptionC(768, c7=160)
        self.Mixed_6e = InceptionC(768, c7=192)
        self.AuxLogits = InceptionAux(768, num_classes)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.dropout = nn.Dropout(p=0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        for block in (
            self.Mixed_5b,
            self.Mixed_5c,
            self.Mixed_5d,
            self.Mixed_6a,
            self.Mixed_6b,
            self.Mixed_6c,
            self.Mixed_6d,
            self.Mixed_6e,
            self.Mixed_7a,
            self.Mixed_7b,
            self.Mixed_7c,
        ):
            x = block(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        out: Tensor = self.fc(self.dropout(x))
        return out


# -- Transformers: BERT-base (Devlin et al. 2019) and GPT-2 small (Radford et al. 2019) -------
def _attention(q: Tensor, k: Tensor, v: Tensor, heads: int, *, causal: bool) -> Tensor:
    b, s, d = q.shape
    q, k, v = (t.view(b, s, heads, d // heads).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return y.transpose(1, 2).reshape(b, s, d)


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, ffn)
        self.output = nn.Linear(ffn, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: Tensor) -> Tensor:
        a = _attention(self.query(x), self.key(x), self.value(x), self.heads, causal=False)
        x = self.attn_norm(x + self.attn_out(a))
        out: Tensor = self.out_norm(x + self.output(F.gelu(self.intermediate(x))))
        return out


class BertBase(nn.Module):
    """Token ids (B, 128) -> pooled [CLS] representation (B, 768); 109.5M parameters."""

    def __init__(
        self,
        *,
        vocab: int = 30522,
        hidden: int = 768,
        layers: int = 12,
        heads: int = 12,
        ffn: int = 3072,
        max_positions: int = 512,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.embed_norm(x + self.token_type_embeddings(torch.zeros_like(input_ids)))
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(self.pooler(x[:, 0]))


class GPT2Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.attn_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.c_attn(self.ln_1(x)).chunk(3, dim=-1)
        x = x + self.attn_proj(_attention(q, k, v, self.heads, causal=True))
        out: Tensor = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return out


class GPT2(nn.Module):
    """Token ids (B, 128) -> next-token logits (B, 50257); 124.4M parameters (tied head).

    The full transformer runs on every position; the tied LM head is applied to the last
    position only, which is what serving the next token needs.
    """

    def __init__(
        self, *, vocab: int = 50257, hidden: int = 768, layers: int = 12, heads: int = 12
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(1024, hidden)
        self.blocks = nn.ModuleList(GPT2Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        last = self.ln_f(x[:, -1])
        return F.linear(last, self.wte.weight)


# -- the registry ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Input:
    shape: tuple[int, ...]  # without the batch dimension
    dtype: torch.dtype
    high: int = 0  # for integer token ids: values in [0, high)


@dataclass(frozen=True, slots=True)
class _Entry:
    build: Callable[[], nn.Module]
    inputs: tuple[_Input, ...]
    # Bump when the architecture or its initialisation changes: it changes model_digest, so
    # profiles measured on the old definition are not reused.
    version: int = 1


_ZOO: dict[str, _Entry] = {
    "resnet50": _Entry(ResNet50, (_Input((3, 224, 224), torch.float32),)),
    "inception_v3": _Entry(InceptionV3, (_Input((3, 299, 299), torch.float32),)),
    "bert-base": _Entry(BertBase, (_Input((128,), torch.int64, high=30522),)),
    "gpt2": _Entry(GPT2, (_Input((128,), torch.int64, high=50257),)),
    "tiny": _Entry(Tiny, (_Input((16,), torch.float32),)),
}
ZOO_NAMES: tuple[str, ...] = tuple(_ZOO)
_ALIASES = {
    "resnet-50": "resnet50",
    "inception-v3": "inception_v3",
    "inceptionv3": "inception_v3",
    "bert": "bert-base",
    "bert_base": "bert-base",
    "gpt-2": "gpt2",
}


def _zoo_key(spec: str) -> str | None:
    name = spec.strip()
    name = name.removeprefix("zoo:").lower()
    name = _ALIASES.get(name, name)
    return name if name in _ZOO else None


def is_zoo_name(spec: str) -> bool:
    return _zoo_key(spec) is not None


def model_name(spec: str) -> str:
    """The model's short name: the canonical zoo name, or the file's stem."""
    key = _zoo_key(spec)
    return key if key is not None else Path(spec).stem


def _seeded(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = build()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _model_path(spec: str) -> Path:
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".mar":
        raise ZooError(
            f"{spec}: a .mar archive is served by TorchServe; load_model takes a zoo name "
            f"({', '.join(ZOO_NAMES)}) or a TorchScript file"
        )
    if not path.is_file():
        raise ZooError(
            f"unknown model {spec!r}: not a zoo name ({', '.join(ZOO_NAMES)}) and no such file"
        )
    return path


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """TorchScript is the user-facing format here; torch 2.x flags it deprecated on every call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def load_model(spec: str) -> nn.Module:
    """Build a zoo model (random weights, fixed seed) or load a TorchScript file, in eval mode."""
    key = _zoo_key(spec)
    if key is not None:
        return _seeded(_ZOO[key].build)
    path = _model_path(spec)
    try:
        with _quiet_jit():
            module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    except (RuntimeError, ValueError) as exc:
        raise ZooError(f"{spec}: not a loadable TorchScript file: {exc}") from None
    module.eval()
    return module  # type: ignore[no-any-return]


def _file_inputs(path: Path) -> tuple[_Input, ...] | None:
    extra = {EXTRA_FILE: ""}
    try:
        with _quiet_jit():
            torch.jit.load(str(path), map_location="cpu", _extra_files=extra)  # type: ignore[no-untyped-call]
    except (RuntimeError, ValueError) as exc:
        raise ZooError(f"{path}: not a loadable TorchScript file: {exc}") from None
    text = extra[EXTRA_FILE]
    if not text:
        return None
    try:
        data = json.loads(text)
        return tuple(
            _Input(
                tuple(int(d) for d in item["shape"]),
                getattr(torch, str(item.get("dtype", "float32"))),
                int(item.get("high", 0)),
            )
            for item in data["inputs"]
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ZooError(f"{path}: malformed {EXTRA_FILE}: {exc}") from None


def input_spec(spec: str) -> list[dict[str, Any]]:
    """The model's inputs as JSON-able dicts ``{"shape", "dtype", "high"}`` (no batch dim)."""
    return [
        {"shape": list(i.shape), "dtype": str(i.dtype).removeprefix("torch."), "high": i.high}
        for i in _inputs(spec)
    ]


def _inputs(spec: str) -> tuple[_Input, ...]:
    key = _zoo_key(spec)
    if key is not None:
        return _ZOO[key].inputs
    path = _model_path(spec)
    inputs = _file_inputs(path)
    if inputs is None:
        raise ZooError(
            f"{spec}: the TorchScript file does not describe its input; save it with "
            f"packrat.runtime.zoo.save_torchscript(model, path, inputs=[(shape, dtype)])"
        )
    return inputs


def example_input(spec: str, batch: int) -> Tensor | tuple[Tensor, ...]:
    """A deterministic random input of batch ``batch``: one tensor, or a tuple for several."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    generator = torch.Generator().manual_seed(SEED)
    tensors: list[Tensor] = []
    for item in _inputs(spec):
        shape = (batch, *item.shape)
        if item.dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=generator, dtype=item.dtype))
        else:
            high = item.high or 2
            tensors.append(torch.randint(0, high, shape, generator=generator, dtype=item.dtype))
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def save_torchscript(
    model: nn.Module | torch.jit.ScriptModule,
    path: str | Path,
    *,
    inputs: Sequence[tuple[Sequence[int], torch.dtype]],
) -> None:
    """Script (if needed) and save ``model`` with its input description, for ``load_model``."""
    with _quiet_jit():
        scripted = model if isinstance(model, torch.jit.ScriptModule) else torch.jit.script(model)
    meta = {
        "inputs": [
            {"shape": [int(d) for d in shape], "dtype": str(dtype).removeprefix("torch.")}
            for shape, dtype in inputs
        ]
    }
    with _quiet_jit():
        torch.jit.save(scripted, str(path), _extra_files={EXTRA_FILE: json.dumps(meta)})


def model_digest(spec: str) -> str:
    """A stable id of what would be loaded: zoo name + architecture version, or the sha256 of
    the file (TorchScript or .mar).

    Profiles are keyed by it, so a changed model (file content or zoo definition) is
    re-profiled and an unchanged one never is.
    """
    key = _zoo_key(spec)
    if key is not None:
        text = f"packrat-zoo/{key}/v{_ZOO[key].version}/seed{SEED}"
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    mar = Path(spec).expanduser()
    path = mar if mar.suffix.lower() == ".mar" and mar.is_file() else _model_path(spec)
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def parameter_count(model: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in model.parameters())
