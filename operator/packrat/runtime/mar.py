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
    "parse_predict_response",
    "request_value",
    "sha256_bytes",
]

MANIFEST = "MAR-INF/MANIFEST.json"


class HandlerError(RuntimeError):
    """The archive cannot be loaded, or its handler failed a batch."""


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
                "parameters": [
                    {"name": "body", "contentType": ctype, "value": request_value(body, ctype)}
                ],
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
