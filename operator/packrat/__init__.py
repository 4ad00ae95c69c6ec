"""Packrat operator: serve PyTorch models on CPU nodes with optimal thin-instance plans.

Layers (imports only go down, enforced by import-linter):
``cli`` > ``controller`` > ``profiler`` | ``serve`` > ``runtime`` > ``plan``.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# Neither engine library may phone home from a Packrat process. A serving pod must not reach
# out to the network (its egress is the owner's business), its home is not writable, and a
# zygote must hold no thread when it forks (TorchServe's handler base imports both libraries
# when they are installed, so a zygote imports them even for an eager model).
# ONNX Runtime (the optional ``onnxruntime`` engine) starts its telemetry thread on import
# unless ``ORT_DISABLE_TELEMETRY`` is set (a user's own setting is kept).
_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
# OpenVINO (the optional ``openvino`` engine) sends usage telemetry on import, from a thread,
# unless a consent file in the user's home says no (its documented opt-out, ``opt_in_out
# --opt_out``, writes that file; there is no environment switch). It falls back to its own
# no-op stub when the telemetry package cannot be imported, so Packrat's processes make it
# unimportable (a process that imported it already keeps it).
_sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
