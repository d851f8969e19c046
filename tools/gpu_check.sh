#!/usr/bin/env bash
# Every GPU figure of issue 26 in one call, in under 6 minutes: the cuda-marked tests, then
# tools/bench_gpu.py --quick, then one summary table (tools/gpu_summary.py).
#
#   tools/gpu_check.sh [OUT_DIR]        # default: $OUT (the device machine's return folder) or /tmp/wanrt-gpu-check
#
# Written for a bare GPU machine that has torch with CUDA, cupy, pytest, hypothesis and pytest-timeout but
# no package registry and no wanrt installed (this checkout is put on PYTHONPATH). pytest-asyncio is not
# needed: the cuda-marked tests are synchronous, only their files are collected, and pytest merely warns
# about pyproject's asyncio_mode key without the plugin. Wheels carried in .whl/ (e.g. pytest-asyncio, or
# a cupy for another CUDA) are installed into /tmp/wanrt-site first (docs/kernels.md, "On a GPU").
#
# Output (8 files at most, so all of them come back from a device run): env.txt, cuda-tests.log,
# cuda-tests.xml, bench_gpu.log, bench_gpu.json, e2e-logs.tgz, gpu_profile.txt, summary.txt. Exit status:
# that of tools/gpu_summary.py (0 when every collected test passed or was skipped and the benchmark wrote its JSON).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-/tmp/wanrt-gpu-check}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
t0=$(date +%s)

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/wanrt-site .whl/*.whl && export PYTHONPATH="/tmp/wanrt-site:$PYTHONPATH"
fi

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
    "$PY" - <<'PYEOF' 2>&1
import importlib.util, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
for mod in ("cupy", "numba", "pytest_asyncio", "pytest_timeout", "hypothesis"):
    spec = importlib.util.find_spec(mod)
    version = "missing"
    if spec is not None:
        m = __import__(mod)
        version = getattr(m, "__version__", "present")
    print(mod, version)
PYEOF
} >"$OUT_DIR/env.txt"
cat "$OUT_DIR/env.txt"

# 1. every cuda-marked test (their files only: nothing else is collected, no async test is imported)
mapfile -t files < <(grep -rlE "pytest\.mark\.cuda" tests --include='test_*.py' | sort)
echo "== ${#files[@]} files with cuda-marked tests =="
timeout 180 "$PY" -m pytest -m cuda -q -p no:cacheprovider -rs --timeout 120 \
    --junitxml="$OUT_DIR/cuda-tests.xml" "${files[@]}" 2>&1 | tee "$OUT_DIR/cuda-tests.log"

# 2. the benchmark: it saves its JSON after the kernel sections and again at the end, so a two-site run cut
# short by the timeout still leaves every kernel figure (its logs are packed into one file)
e2e=$(mktemp -d /tmp/wanrt-gpu-e2e-XXXXXX)
timeout 150 "$PY" tools/bench_gpu.py --quick --json "$OUT_DIR/bench_gpu.json" --out "$e2e" 2>&1 \
    | tee "$OUT_DIR/bench_gpu.log"
tar czf "$OUT_DIR/e2e-logs.tgz" -C "$e2e" . 2>/dev/null || true

# 3. where the time goes (host functions, device kernels and copies; the host cost of each part of a
# step, unprofiled): for the next change, not a key
timeout 60 "$PY" tools/gpu_profile.py --out "$OUT_DIR/gpu_profile.txt" >/dev/null 2>&1 \
    || echo "gpu_profile failed or timed out" | tee -a "$OUT_DIR/gpu_profile.txt"
timeout 60 "$PY" tools/gpu_micro.py >>"$OUT_DIR/gpu_profile.txt" 2>&1 \
    || echo "gpu_micro failed or timed out" | tee -a "$OUT_DIR/gpu_profile.txt"

# 4. the table
echo "== summary ($(($(date +%s) - t0)) s) =="
"$PY" tools/gpu_summary.py "$OUT_DIR" | tee "$OUT_DIR/summary.txt"
exit "${PIPESTATUS[0]}"
