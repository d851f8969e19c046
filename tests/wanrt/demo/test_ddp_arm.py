"""The real-DDP arm really all-reduces across namespaces: 3 sites × 1 rank in 3 network namespaces (a mesh,
where two sites reach the third's home address through a host route, and a bridge), a tiny model. Each
rank's own gradient differs (different data shards); after DDP's backward all hold the same gradient, the
mean of the three, and the bytes crossed the shaped links.
Needs root and namespaces (skipped with the probe's reason otherwise); every namespace is gone afterwards.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from sims.netns import list_namespaces, probe
from sims.netns.topology import Topology
from wanrt.demo.config import QUICK
from wanrt.demo.netns_sites import NetnsSites


def _require_netns() -> None:
    reason = probe().skip_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize("topology", ["mesh", "bridge"])
def test_ddp_ranks_in_three_namespaces_end_with_the_mean_gradient(tmp_path: Path, topology: Topology) -> None:
    _require_netns()
    from wanrt.demo.ddp_arm import run_ddp

    cfg = dataclasses.replace(QUICK, sites=3, model_hidden=4, max_iters=2, eval_every=0, batch=8)
    with NetnsSites(3, 100e6, topology=topology) as net:
        names = set(net.emu.namespaces)
        assert names <= set(list_namespaces())
        run = run_ddp(cfg, net, tmp_path, report_gradients=True, on_line=lambda _: None)
    assert not names & set(list_namespaces()), "namespaces left behind"
    locals_ = [np.asarray(run.gradients[r][0]) for r in range(3)]
    reduced = [np.asarray(run.gradients[r][1]) for r in range(3)]
    assert not np.allclose(locals_[0], locals_[1]), "two shards gave the same gradient: nothing to average"
    np.testing.assert_array_equal(reduced[0], reduced[1])
    np.testing.assert_array_equal(reduced[0], reduced[2])
    np.testing.assert_allclose(reduced[0], sum(locals_) / 3, rtol=1e-5, atol=1e-7)
    r = run.result
    assert r.mode == "ddp" and r.iterations == 2 and r.distinct_final_models == 1
    params = 64 * 4 + 4 + 4 * 4 + 4 + 4 * 10 + 10
    # two all-reduces of every parameter left each site through its shaped links (plus headers)
    assert all(sent >= 2 * params * 4 for sent in r.bytes_sent_per_site.values()), r.bytes_sent_per_site


def test_ddp_arm_trains_to_the_target_and_agrees_with_itself(tmp_path: Path) -> None:
    _require_netns()
    from wanrt.demo.ddp_arm import run_ddp

    cfg = dataclasses.replace(QUICK, model_hidden=64, max_iters=100, eval_every=5, target_loss=1.0)
    with NetnsSites(2, 1e9) as net:
        r = run_ddp(cfg, net, tmp_path, on_line=lambda _: None).result
    assert r.tta_s is not None and r.iters_to_target is not None and r.iters_to_target % 5 == 0
    # the evaluator's stop is broadcast: every rank stops at the iteration the target was seen
    assert r.iterations == r.iters_to_target
    assert r.curve[0].loss > 1.0 >= r.curve[-1].loss
    assert r.distinct_final_models == 1
    assert [i for i, _ in r.step_times] == list(range(1, r.iterations + 1))
