"""The model file a command takes (``packrat profile``/``serve --model``), and its inputs.

A TorchScript (``.pt``), ``torch.export`` (``.pt2``) or ONNX (``.onnx``) file is checked
here, before any worker or zygote starts: its inputs known (``--inputs``, else what the
file itself says), the file loaded and a batch of two run through it. A model that fails
is one line and exit 2, never a worker's traceback after the pod listens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.cli import CliError

MODEL_FILES = (".pt", ".pth", ".ts", ".pt2", ".onnx")


def add_inputs_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inputs",
        metavar="JSON|@FILE",
        help=(
            "a model file's inputs, as KServe/Triton give them: "
            '\'[{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]\' (-1: the batch), '
            "Triton's dims/data_type, or @FILE holding them or a sample v2 inference request; "
            "needed for a plain torch.jit.save file, checked against an ONNX graph"
        ),
    )


def check_model_file(model: str, inputs: str | None) -> None:
    """Declare ``inputs`` for every process this one starts and check the model file with
    them; a zoo name or ``.mar`` passes untouched (and takes no ``--inputs``)."""
    from packrat.runtime import inputs as declared
    from packrat.runtime import modelid

    is_file = not modelid.is_zoo_name(model) and Path(model).suffix.lower() in MODEL_FILES
    if not is_file:
        if inputs is not None:
            raise CliError(
                f"--inputs applies to a model file ({', '.join(MODEL_FILES)}), not {model}"
            )
        return
    if inputs is not None:
        try:
            declared.declare(declared.parse_option(inputs))
        except declared.InputsError as exc:
            raise CliError(str(exc)) from None
    if not Path(model).expanduser().is_file():
        raise CliError(modelid.unknown_model(model))
    from packrat.runtime import zoo
    from packrat.runtime.engines import EngineError

    try:
        zoo.check_model(model)
    except (zoo.ZooError, EngineError) as exc:
        raise CliError(str(exc)) from None
