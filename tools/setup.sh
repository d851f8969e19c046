#!/usr/bin/env bash
# Installs everything wanrt needs into the current Python environment, from the project's own files.
#   bash tools/setup.sh          runtime (enough for `wanrt demo`)
#   bash tools/setup.sh --test   runtime + test tools (pytest, hypothesis, ruff, mypy)
# torch is pinned to the CPU build first: a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=""
if [[ "${1:-}" == "--test" ]]; then extra="[test]"; fi
python -m pip install --quiet --disable-pip-version-check 'torch==2.13.0'
python -m pip install --quiet --disable-pip-version-check -e ".${extra}"
# pyenv installs console scripts behind shims that exist only after a rehash.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
