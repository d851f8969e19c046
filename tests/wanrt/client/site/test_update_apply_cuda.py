"""The client's apply on a CUDA parameter: each layer's averaged update goes into a pinned buffer of its
own and to the device with one DMA (``UpdateApplier``, ``cupy_staging``); the parameters end bit for bit
where the same updates leave a CPU copy of them (skipped without CuPy and a CUDA device)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.cuda_support import CUDA_SKIP
from tests.wanrt.kernels.conftest import forced_path, random_update
from wanrt.client.site.decision import SiteUpdate
from wanrt.client.site.update_apply import UpdateApplier
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.kernels import make_sparse_optimizer

pytestmark = [pytest.mark.cuda, CUDA_SKIP]


@pytest.mark.parametrize("wire", ["fp16", "fp32"])
def test_cuda_parameters_get_the_cpu_parameters_bits(wire: str) -> None:
    rng = np.random.default_rng(5)
    sizes = [4096 + 7, 30_000]
    cpu = [torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in sizes]
    gpu = [t.clone().cuda() for t in cpu]
    opt_c, opt_g = make_sparse_optimizer("adam", lr=0.01), make_sparse_optimizer("adam", lr=0.01)
    app_c, app_g = UpdateApplier(), UpdateApplier()
    for it in range(8):
        ups = []
        for layer, n in enumerate(sizes):
            p = in_wire_dtype(random_update(rng, n, 16, 0.1), wire)
            p = dataclasses.replace(p, layer=layer)
            ups.append(SiteUpdate(it, layer, 1 + it % 3, p))
        with forced_path("numpy"):
            app_c.apply(ups, cpu, opt_c)
        app_g.apply(ups, gpu, opt_g)
    torch.cuda.synchronize()
    for c, g in zip(cpu, gpu, strict=True):
        np.testing.assert_array_equal(g.cpu().numpy(), c.numpy())
    assert all(b is not None for b in app_g._pinned.values())  # the pinned path was taken
