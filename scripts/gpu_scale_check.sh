#!/usr/bin/env bash
# The GPU's checks of issue 41, in one command on a machine with a CUDA device and PyTorch:
# tests/test_cuda.py, the demo on CUDA and on the machine's CPUs, and 1,000 Fashion-MNIST
# clients of fedavg one at a time (client_batch=1) against stacked (client_batch=256) on the
# GPU. Results go to $OUT (default runs/gpu-check; the steps' logs in logs.tgz); each step has
# its own time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
# the data: Debian's package where installed, else a folder of the four IDX files
export ONESHOTFL_DATA=${ONESHOTFL_DATA:-$PWD/.fmnist}
PY=${PY:-python3}
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
nproc
step() {  # name, limit in seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  echo "$name: rc $rc, $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
  tail -n 4 "$OUT/$name.log"
}
step test_cuda 240 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py
step demo_cuda 150 $PY -m oneshotfl run --config configs/demo.yaml device=cuda cache_dir= --out "$OUT/demo-cuda"
step demo_cpu 200 $PY -m oneshotfl run --config configs/demo.yaml device=cpu cache_dir= --out "$OUT/demo-cpu"
scale="--method fedavg --dataset fashion_mnist --partition dirichlet --alpha 0.5 --clients 1000
  --local-epochs 1 --local-steps 0 --no-cache device=cuda"
# shellcheck disable=SC2086
step scale_cuda_cb1 150 $PY -m oneshotfl run $scale client_batch=1 --out "$OUT/scale-cb1"
# shellcheck disable=SC2086
step scale_cuda_cb256 150 $PY -m oneshotfl run $scale client_batch=256 --out "$OUT/scale-cb256"
for d in demo-cuda demo-cpu scale-cb1 scale-cb256; do
  [ -f "$OUT/$d/result.json" ] && cp "$OUT/$d/result.json" "$OUT/$d.json"
  rm -rf "${OUT:?}/$d"
done
# the logs in one file (a device's copy-back takes few files)
(cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log)
