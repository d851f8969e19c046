"""The gateway's codec warm-up leaves numba out of a process that only relays small payloads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from wanrt.codec.kernel_choice import KERNEL_ENV
from wanrt.kernel_env import FUSED_MIN_VALUES

REPO = Path(__file__).resolve().parents[3]
LIMIT = FUSED_MIN_VALUES


def test_a_process_that_sees_only_small_payloads_never_imports_numba() -> None:
    code = f"""
import sys
import numpy as np
from gateways.service.codec_warmup import warm_up_codec
from wanrt.codec import decode_payload, encode_payload
from wanrt.codec.kernel_choice import FUSED_MIN_VALUES, fused_loader
from wanrt.payload import SparsePayload

warm_up_codec()
p = SparsePayload.from_dense_blocks(0, np.ones(10**6, np.float32), np.arange(0, {LIMIT // 16 - 1}) * 3, 16)
assert p.nnz < FUSED_MIN_VALUES
for dtype in ("fp32", "fp16", "bf16"):
    meta, bufs = encode_payload(p, wire_dtype=dtype)
    decode_payload(meta, [bytes(b) for b in bufs])
assert "numba" not in sys.modules and "llvmlite" not in sys.modules, "numba loaded"
assert not fused_loader().started
"""
    env = {k: v for k, v in os.environ.items() if k != KERNEL_ENV}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
