"""Run a TorchServe model archive's handler in this process, the way TorchServe's worker does.

The profiler measures a ``.mar`` through the code a serving worker runs: the archive is
extracted, its directory put first on ``sys.path`` and made the working directory (as
TorchServe's frontend does for its Python workers), and the handler is loaded by TorchServe's
own :class:`ts.model_loader.TsModelLoader` and called through :meth:`ts.service.Service.predict`
with a batch built like the one its socket protocol decodes (JSON bodies parsed, text bodies
decoded, anything else left as bytes). Only the JVM frontend and the socket are left out.

Imports ``ts`` lazily; torch is imported by the handler itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "HandlerError",
    "HandlerService",
    "extract_archive",
    "form_fields",
    "is_archive",
    "parse_predict_response",
    "request_parameters",
    "request_row",
    "request_value",
    "sha256_bytes",
]

MANIFEST = "MAR-INF/MANIFEST.json"


class HandlerError(RuntimeError):
    """The archive cannot be loaded, or its handler failed a batch."""


def is_archive(spec: str) -> bool:
    """Whether a model spec names a TorchServe model archive (``.mar``)."""
    return spec.endswith(".mar")


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def extract_archive(mar: Path, dest: Path) -> tuple[Path, dict[str, Any]]:
    """Unpack ``mar`` into ``dest`` (replaced); returns the directory and the manifest."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        with zipfile.ZipFile(mar) as archive:
            for name in archive.namelist():
                target = (dest / name).resolve()
                if not target.is_relative_to(dest.resolve()):
                    raise HandlerError(f"{mar}: member {name!r} escapes the archive directory")
            archive.extractall(dest)
            manifest: dict[str, Any] = json.loads(archive.read(MANIFEST))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, OSError) as exc:
        raise HandlerError(f"{mar}: not a valid TorchServe model archive ({exc})") from None
    if not manifest.get("model", {}).get("handler"):
        raise HandlerError(f"{mar}: the manifest names no handler")
    return dest, manifest


_FORM = "multipart/form-data"
MAX_FORM_FIELDS = 64


def form_fields(body: bytes, content_type: str) -> list[tuple[str, str, bytes]] | None:
    """A ``multipart/form-data`` body's fields (name, content type, bytes), as TorchServe's
    frontend splits one before its handler sees it (``curl -F data=@img.jpg``: a field
    ``data``); None for any other body, or one that is not a well-formed form (then the
    handler gets the body whole, as it would any other).

    Hand-written (RFC 7578, 40 lines) rather than :mod:`email`'s parser, which is not exact
    for binary parts (it works on lines), or a multipart package in every worker."""
    if not content_type.lower().startswith(_FORM):
        return None
    boundary = _boundary(content_type)
    if boundary is None:
        return None
    delimiter = b"--" + boundary
    chunks = body.split(b"\r\n" + delimiter)
    if not chunks[0].startswith(delimiter) or len(chunks) < 2:
        return None
    chunks[0] = chunks[0][len(delimiter) :]
    if not chunks[-1].startswith(b"--") or len(chunks) - 1 > MAX_FORM_FIELDS:
        return None  # no closing delimiter, or more fields than a request carries
    fields = []
    for chunk in chunks[:-1]:
        head, sep, data = chunk.partition(b"\r\n\r\n")
        if not sep or not head.startswith(b"\r\n"):
            return None
        headers = _part_headers(head[2:])
        name = _param(headers.get("content-disposition", ""), "name")
        if name is None:
            return None
        fields.append((name, headers.get("content-type", ""), data))
    return fields


def _boundary(content_type: str) -> bytes | None:
    value = _param(content_type, "boundary")
    if not value or len(value) > 70 or not value.isascii():
        return None
    return value.encode()


def _param(header: str, key: str) -> str | None:
    """A parameter of a header value (``form-data; name="data"``), quotes removed."""
    for item in header.split(";")[1:]:
        k, sep, v = item.strip().partition("=")
        if sep and k.strip().lower() == key:
            return v.strip().strip('"')
    return None


def _part_headers(head: bytes) -> dict[str, str]:
    out = {}
    for line in head.decode("utf-8", "replace").split("\r\n"):
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip().lower()] = v.strip()
    return out


def request_parameters(body: bytes, content_type: str) -> list[dict[str, Any]]:
    """One request's parameters as TorchServe's worker gets them: a form's fields by name,
    any other body as ``body``; each value decoded as :func:`request_value` says."""
    fields = form_fields(body, content_type)
    if fields is None:
        fields = [("body", content_type, body)]
    return [
        {"name": name, "contentType": ctype, "value": request_value(data, ctype)}
        for name, ctype, data in fields
    ]


def request_row(body: bytes, content_type: str) -> dict[str, Any]:
    """What a handler's ``data[i]`` is for one request: ``{name: value}`` of its parameters."""
    return {p["name"]: p["value"] for p in request_parameters(body, content_type)}


def request_value(body: bytes, content_type: str) -> Any:
    """What TorchServe's worker hands a handler for one request body of ``content_type``."""
    if content_type == "application/json":
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):  # as TorchServe: any failure
            return body  # leaves the bytes (deep nesting, an integer of thousands of digits)
    if content_type.startswith("text"):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return body
    return body


def parse_predict_response(data: bytes) -> tuple[int, str, list[tuple[int, str, bytes]]]:
    """TorchServe's worker-to-frontend prediction message (``ts.protocol.otf_message_handler.
    create_predict_response``): the batch's code and message, then each request's status,
    content type and body (the request ids, reason phrases and headers are read past)."""
    offset = 0

    def integer() -> int:
        nonlocal offset
        if offset + 4 > len(data):
            raise HandlerError("a truncated prediction response from the handler's service")
        (value,) = struct.unpack_from("!i", data, offset)
        offset += 4
        return int(value)

    def chunk(length: int) -> bytes:
        nonlocal offset
        if length < 0 or offset + length > len(data):
            raise HandlerError("a truncated prediction response from the handler's service")
        offset += length
        return data[offset - length : offset]

    code = integer()
    message = chunk(integer()).decode(errors="replace")
    answers = []
    while True:
        id_length = integer()
        if id_length == -1:
            break
        chunk(id_length)
        ctype = chunk(integer()).decode(errors="replace")
        status = integer()
        chunk(integer())  # reason phrase
        for _ in range(integer()):  # headers
            chunk(integer())
            chunk(integer())
        answers.append((status, ctype or "application/json", chunk(integer())))
    return code, message, answers


class HandlerService:
    """One archive's handler, loaded once, answering batches of the same sample request."""

    def __init__(
        self,
        *,
        mar: Path,
        workdir: Path,
        batch_size: int = 1,
        name: str | None = None,
        extracted: tuple[Path, dict[str, Any]] | None = None,
    ) -> None:
        """Load ``mar`` (extracted under ``workdir``, or ``extracted``: the directory and
        manifest an earlier :func:`extract_archive` made), as model ``name`` (default: the
        manifest's)."""
        model_dir, manifest = extracted or extract_archive(mar, workdir / "model")
        model = manifest["model"]
        self.name = name or str(model.get("modelName") or mar.stem)
        self.handler = str(model["handler"])
        self.model_dir = model_dir
        sys.path.insert(0, str(model_dir))
        os.chdir(model_dir)
        from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
        from ts.model_loader import ModelLoaderFactory

        metrics_config = Path(sys.modules["ts"].__file__ or "").parent / "configs" / "metrics.yaml"
        metrics = MetricsCacheYamlImpl(config_file_path=str(metrics_config))
        metrics.initialize_cache()
        metrics.model_name = self.name
        try:
            self.service = ModelLoaderFactory.get_model_loader().load(
                self.name,
                str(model_dir),
                self.handler,
                None,  # CPU
                batch_size,
                model.get("envelope") or None,
                True,
                metrics,
            )
        except Exception as exc:
            raise HandlerError(
                f"loading {mar.name} (handler {self.handler}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.service.set_cl_socket(None)  # no frontend socket: streaming replies are dropped

    def predict_each(self, items: Sequence[tuple[bytes, str]]) -> list[tuple[int, str, bytes]]:
        """Run one batch of (body, content type) through the handler, as TorchServe's worker
        does; each request's (status, content type, body), as TorchServe's frontend would
        answer it. A handler that raised fails its whole batch with TorchServe's error body."""
        batch = [
            {
                "requestId": f"r{i}".encode(),
                "parameters": request_parameters(body, ctype),
            }
            for i, (body, ctype) in enumerate(items)
        ]
        code, message, answers = parse_predict_response(bytes(self.service.predict(batch)))
        if code != 200 or len(answers) != len(items):
            error = json.dumps(
                {"code": code, "type": "InternalServerException", "message": message}
            )
            status = code if code >= 400 else 503
            return [(status, "application/json", error.encode())] * len(items)
        return answers

    def predict(self, bodies: Sequence[bytes], *, content_type: str) -> int:
        """Run one batch (one request per body) through the handler; returns the code (200)."""
        batch = [
            {
                "requestId": f"profile-{i}".encode(),
                "parameters": [
                    {
                        "name": "body",
                        "contentType": content_type,
                        "value": request_value(body, content_type),
                    }
                ],
            }
            for i, body in enumerate(bodies)
        ]
        response = self.service.predict(batch)
        code = struct.unpack("!i", bytes(response[:4]))[0] if response else 500
        if code != 200:
            length = struct.unpack("!i", bytes(response[4:8]))[0]
            message = bytes(response[8 : 8 + length]).decode(errors="replace")
            raise HandlerError(
                f"the handler of {self.name} answered {code} ({message}) for a batch of "
                f"{len(bodies)} sample request(s); see the worker log above"
            )
        for idx in range(len(bodies)):
            status = self.service.context.get_response_status(idx)
            request_code = status[0] if isinstance(status, tuple) else 200
            if request_code and int(request_code) >= 400:
                raise HandlerError(
                    f"the handler of {self.name} answered {request_code} for the sample "
                    f"request: fix --sample-request (it must be a request the model accepts)"
                )
        return code
