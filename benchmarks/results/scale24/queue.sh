#!/usr/bin/env bash
# issue 24 measurements, one after the other (scale24)
cd /work/wt-scale24
R=benchmarks/results/scale24
while pgrep -f "scale_experiment.py --model resnet50 --cpus 2 --batch 4,8,16" >/dev/null; do sleep 10; done
for round in 1 2; do
  for proc in fresh forked; do
    out=$R/startup/resnet50-$proc-$round
    cmd=".venv/bin/python -m packrat profile --model resnet50 --cpus 2 --max-batch 8 --precision 0.05 --point-budget 5 --allow-contended --process $proc -o $out.json"
    { echo "\$ $cmd"; echo "load before: $(cat /proc/loadavg)"; /usr/bin/time -f "wall %e s" $cmd; echo "load after: $(cat /proc/loadavg)"; } > $out.log 2>&1
  done
done
for m in resnet50 inception_v3; do
  .venv/bin/python benchmarks/scale_experiment.py --model $m --cpus 2 --batch 1,2,4,8,16 --max-batch 16 --modes co-located --repeats 6 --point-budget 8 --warmup 1 --min-samples 5 --colocated-budget 300 --thread-grid auto --out $R/$m-2cpu-models > /tmp/s24-$m.log 2>&1
done
for m in bert-base gpt2; do
  .venv/bin/python benchmarks/scale_experiment.py --model $m --cpus 2 --batch 1,2,4,8 --max-batch 8 --modes co-located --repeats 6 --point-budget 8 --warmup 1 --min-samples 5 --colocated-budget 300 --thread-grid auto --out $R/$m-2cpu-models > /tmp/s24-$m.log 2>&1
done
echo done > /tmp/s24-queue.done
