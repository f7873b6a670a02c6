#!/usr/bin/env bash
# Issue 37's accelerator check, in one process tree and at most 6 minutes: the GRPO update
# (perf/train_bench.py --gpu: Qwen2-0.5B shapes, 64 rows x 2,048 tokens, bf16, remat) with
# cuDNN and XLA attention at 4 and 1 micro-batches, the sampler (rollout_bench.py --gpu, JAX only),
# and the PyTorch peer update of the same shapes (torch_peer_update.py --gpu); then one table with
# tokens/s, MFU and the ratio hsjax / peer (perf/accelerator_table.py).
#
#   bash perf/accelerator_check.sh               # on a GPU machine, from the repository root
#   bash perf/accelerator_check.sh --dry-run     # CPU, tiny shapes, under a minute (a test runs it)
#
# Expects: python3 with jax (CUDA), flax, optax, orbax, chex, torch and transformers (the device
# image has them). Pure-Python packages missing there (ml_collections, which hsjax's config code
# imports) travel as wheels in .whl/ (docs/performance.md, "Memory plan per device", says how);
# when .whl/ holds any, they are installed into /tmp/site first. Each step has its own timeout, so
# one that hangs costs its share only; a step that fails or times out is a row saying so.
# Results: one JSON per step under $OUT (the device tool's folder) or ./accelerator_check/.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PY=${PYTHON:-python3}
DIR=${OUT:-accelerator_check}
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

if [ $DRY = 1 ]; then
  # Tiny shapes on the CPU: every step and the table run, none of the numbers mean anything.
  export JAX_PLATFORMS=cpu
  TRAIN="--preset tiny --T 64 --groups 1 --n 2 --R 2 --steps 1 --dtype float32"
  ATTN=(xla)
  SAMPLER="--gpu --preset tiny --batches 2 --prompt 16 --new 4 --reps 1 --skip-hf --copy-bytes 1048576"
  PEER="--preset tiny --T 64 --groups 1 --n 2 --R 2 --steps 1"
  LIMIT=(300 300 300)  # generous: a loaded 2-core CI machine, not the 6-minute budget of the GPU run
else
  TRAIN="--gpu --steps 2"
  ATTN=(cudnn xla)
  SAMPLER="--gpu --reps 2 --skip-hf"
  PEER="--gpu --steps 2"
  LIMIT=(65 40 60)  # seconds: each update run (4 of them), the sampler, the peer: 360 s in all
fi

step() {  # name, limit (s), command...
  local name=$1 limit=$2
  shift 2
  echo "== $name: $* (at most ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" >"$DIR/$name.log" 2>&1
  local rc=$?
  tail -n 3 "$DIR/$name.log"
  [ $rc = 0 ] || echo "$name: exit $rc (124: timed out)" | tee "$DIR/$name.failed"
}

for attn in "${ATTN[@]}"; do
  for micro in 4 1; do
    step "update_${attn}_${micro}" "${LIMIT[0]}" $PY perf/train_bench.py $TRAIN \
      --attention "$attn" --micro-batches "$micro" --out "$DIR/update_${attn}_${micro}.json"
  done
done
# The sampler's prefill and the peer each take the whole GPU: JAX's preallocation would starve
# torch, so the peer runs last, in its own process, after every JAX process has ended.
step sampler "${LIMIT[1]}" $PY perf/rollout_bench.py $SAMPLER --out "$DIR/sampler.json"
step peer "${LIMIT[2]}" $PY perf/torch_peer_update.py $PEER --micro-batches 4 --out "$DIR/peer.json"
$PY perf/accelerator_table.py "$DIR"
