"""The stored gRPC descriptor matches grpc_predict_v2.proto (regenerated with protoc), and its
messages live apart from a client library's ``inference.*`` messages in the same process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_the_stored_descriptor_is_the_protos() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) regenerates it")
    script = ROOT / "scripts" / "gen_oip_descriptor.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_our_messages_and_tritonclients_live_in_one_process() -> None:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc]")
    import tritonclient.grpc.service_pb2 as triton

    from packrat.serve.dispatcher.oip.messages import message

    ours = message("ModelInferRequest")(model_name="m", id="x")
    ours.raw_input_contents.append(b"abc")
    theirs = triton.ModelInferRequest.FromString(ours.SerializeToString())
    assert (theirs.model_name, theirs.id, list(theirs.raw_input_contents)) == ("m", "x", [b"abc"])
