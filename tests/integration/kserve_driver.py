"""Drives the KServe Python SDK's inference clients (REST v2 and gRPC) against a serving pod and
prints what they saw as one JSON document. It runs under .venv/kserve's interpreter (``make
kserve-tools``): kserve 0.21 cannot share the operator's environment. Not a test module: the
conformance tests (test_serve_oip_conformance.py) run it as a subprocess and judge its output.

Usage: python kserve_driver.py REST_URL GRPC_TARGET MODEL ROWS_JSON
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest
from kserve.inference_client import RESTConfig


def request(model: str, x: np.ndarray, *, binary: bool) -> InferRequest:
    tensor = InferInput(name="input__0", shape=list(x.shape), datatype="FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return InferRequest(model_name=model, infer_inputs=[tensor], request_id="k1")


async def rest(url: str, model: str, x: np.ndarray) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    try:
        out: dict[str, Any] = {
            "live": await client.is_server_live(url),
            "ready": await client.is_server_ready(url),
            "model_ready": await client.is_model_ready(url, model),
        }
        for binary in (False, True):
            answer = await client.infer(url, request(model, x, binary=binary), model_name=model)
            out[f"infer_binary_{binary}"] = answer.outputs[0].as_numpy().tolist()
        try:
            await client.infer(url, request(model, x[:, :-1], binary=False), model_name=model)
            out["bad_shape"] = "no error"
        except Exception as exc:  # httpx.HTTPStatusError with the server's message
            response = getattr(exc, "response", None)
            out["bad_shape"] = {"status": getattr(response, "status_code", None), "text": str(exc)}
        return out
    finally:
        await client.close()


async def grpc_calls(target: str, model: str, x: np.ndarray) -> dict[str, Any]:
    client = InferenceGRPCClient(target, timeout=60, retries=2)
    try:
        out: dict[str, Any] = {
            "live": await client.is_server_live(),
            "ready": await client.is_server_ready(),
            "model_ready": await client.is_model_ready(model),
        }
        for binary in (False, True):  # typed contents, then raw_input_contents
            answer = await client.infer(request(model, x, binary=binary))
            out[f"infer_binary_{binary}"] = answer.outputs[0].as_numpy().tolist()
            out["id"] = answer.id
        try:
            await client.infer(request(model, x[:, :-1], binary=True))
            out["bad_shape"] = "no error"
        except grpc.RpcError as exc:
            out["bad_shape"] = {"code": exc.code().name, "text": exc.details()}
        try:
            await client.infer(request("other", x, binary=True))
            out["other_model"] = "no error"
        except grpc.RpcError as exc:
            out["other_model"] = {"code": exc.code().name, "text": exc.details()}
        return out
    finally:
        await client.close()


async def main(url: str, target: str, model: str, rows: str) -> None:
    x = np.asarray(json.loads(rows), dtype=np.float32)
    doc = {"rest": await rest(url, model, x), "grpc": await grpc_calls(target, model, x)}
    print(json.dumps(doc))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
