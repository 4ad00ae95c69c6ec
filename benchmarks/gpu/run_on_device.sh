#!/usr/bin/env bash
# The GPU checks of issue 40 as one command on the device machine (one H100; python3 there has
# torch 2.11+cu130 and CuPy; no network, no kopf). From the repository root:
#   bash benchmarks/gpu/run_on_device.sh            # results under $OUT (or /tmp/gpu-out)
# 1. the CUDA unit tests (they skip without a GPU elsewhere), 2. the measurements (about 2-4
# minutes; bounded at 7 minutes so the whole command stays under 8).
set -u -o pipefail
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
export PYTHONPATH=operator PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)' | tee -a "$out/gpu.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" -k cuda tests/unit/runtime/test_runtime_gpu_tier.py \
  2>&1 | tee "$out/cuda_tests.txt"
timeout 420 python3 benchmarks/gpu/ignite_gpu.py --out "$out/ignite_gpu.json" 2>&1 | tee "$out/ignite_gpu.txt"
