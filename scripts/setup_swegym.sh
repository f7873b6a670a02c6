#!/usr/bin/env bash
# Builds the offline SWE-Gym instances: pinned PyPI sdists -> git repositories with injected bugs ->
# SWE-bench records validated by the scorer, in .cache/swegym (or $HSJAX_SWEGYM_CACHE). Idempotent:
# a package whose cached part is current is not rebuilt, so a second run takes seconds.
# harness_envs/swegym/builder/pipeline.py says what is built and how long it takes.
#
#   scripts/setup_swegym.sh                                             # every package, 12 instances each
#   scripts/setup_swegym.sh --packages toolz,xmltodict --max-per-repo 3   # CI's subset (a train and a test repository)
#   HSJAX_SWEGYM_CACHE=/data/swegym scripts/setup_swegym.sh --jobs 4
#
# Needs git, pip access to PyPI (the sdists and pytest for each package's venv), and this checkout's
# venv (.venv, or SWEGYM_PYTHON). bubblewrap is used for the test runs where installed.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${SWEGYM_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3.11
command -v git >/dev/null || { echo "setup_swegym.sh: git is needed (apt-get install git)" >&2; exit 1; }
cd "$REPO"
exec "$PYTHON" -m harness_envs.swegym.builder "$@"
