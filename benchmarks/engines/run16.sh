#!/usr/bin/env bash
# Packrat on 16 cores with engines: profile ResNet-50 on every engine asked (coarse thread grid,
# bounded), plan, verify the plan against the fastest fat engine, then the engines table
# (engines_bench.py: each engine's thin and fat instances, OpenVINO's own hints) at --cpus 16.
# Makes the 16-core rows of docs/measurements.md's engines section when a device is lent.
# ../shared/measurements/xeon16-resnet50/run16.sh with --engines added (tested here at CPUS=2).
#   usage: ENGINES=eager,onnxruntime,openvino OUT=out16 benchmarks/engines/run16.sh   (--help: this)
set -u
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n 2,7p "$0"; exit 0; fi
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY=${PY:-python3}; CPUS=${CPUS:-16}; THREADS=${THREADS:-1,2,4,8,16}; MAXB=${MAXB:-64}
BATCH=${BATCH:-8,16,32,64}; TB=${TB:-240}; PB=${PB:-10}; REPS=${REPS:-5}
ENGINES=${ENGINES:-eager,onnxruntime,openvino}
OUT=${OUT:-out16}; mkdir -p "$OUT"
export PYTHONPATH="$ROOT/operator" PYTHONUNBUFFERED=1
{ date; nproc; lscpu; grep -i cpus_allowed_list /proc/self/status; $PY -c 'import torch; print(torch.__version__, torch.get_num_threads())'; } > "$OUT/machine.txt" 2>&1
t0=$(date +%s)
timeout $((TB+240)) $PY -m packrat profile --model resnet50 --cpus "$CPUS" --threads "$THREADS" --max-batch "$MAXB" \
  --engines "$ENGINES" --artefacts "$OUT/artefacts" \
  --precision 0.05 --point-budget "$PB" --time-budget "$TB" --allow-contended \
  --verify-batches "$BATCH" --verify-repeats 5 -o "$OUT/profile.json" > "$OUT/profile.log" 2>&1
echo "profile rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^engine|wrote" "$OUT/profile.log"
$PY -m packrat plan --profile "$OUT/profile.json" --cpus "$CPUS" --batch 1,4,$BATCH 2>&1 | tee "$OUT/plan.txt"
t1=$(date +%s)
timeout 240 $PY "$ROOT/benchmarks/engines/engines_bench.py" --models resnet50 --cpus "$CPUS" \
  --batches "$BATCH" --engines "$ENGINES" --reps "$REPS" --artefacts "$OUT/artefacts" \
  --out "$OUT/engines.json" > "$OUT/engines.txt" 2>&1
echo "engines rc=$? $(( $(date +%s)-t1 ))s"; tail -"$(echo "$BATCH" | tr ',' '\n' | wc -l)" "$OUT/engines.txt"
