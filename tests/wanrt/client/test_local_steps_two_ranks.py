"""Local steps on a site of two gloo ranks: a change of k announced to the leader reaches the other rank
with the site's decision and applies at the same WAN iteration on both; the leader pushes the site's sum
over ranks and micro-steps divided by ranks × k, and both ranks end with the same parameters."""

from __future__ import annotations

import numpy as np

from tests.wanrt.client.gloo_ranks import run_gloo_ranks

SCRIPT = """
import json, sys, torch, wanrt
from tests.wanrt.client.fake_link import scripted
from wanrt.client.site.decision import ConfigChange
rank = int(sys.argv[1])
links = []
cfg = wanrt.ClientConfig.dense_baseline(staleness=0, update_deadline_s=20.0, local_steps=3)
ctx = wanrt.client.init("mem://gw", site="a", job="j", secret=b"0123456789abcdef-secret", config=cfg,
                        link_factory=scripted({}, links))
w = torch.nn.Parameter(torch.zeros(8))
opt = wanrt.SparseOptimizer([("w", w)], "sgd", lr=1.0, ctx=ctx)
if links:
    links[0].announce(ConfigChange(effective_iteration=1, local_steps=2))
seen = []
for t in range(7):  # iteration 0: 3 micro-steps, 1 and 2: 2 each
    seen.append([ctx.iteration, ctx.local_steps, ctx.micro_step])
    c = torch.arange(8, dtype=torch.float32) * (t + 1) + 100 * rank
    (w * c).sum().backward()
    opt.step()
    opt.zero_grad()
pushed = {f"{it}": p.to_dense().tolist() for it, layer, p in links[0].pushed} if links else {}
print(json.dumps({"seen": seen, "w": w.detach().tolist(), "pushed": pushed}))
ctx.close()
"""


def test_two_ranks_switch_local_steps_at_the_same_wan_iteration() -> None:
    outs = run_gloo_ranks(SCRIPT)
    want_seen = [[0, 3, 0], [0, 3, 1], [0, 3, 2], [1, 2, 0], [1, 2, 1], [2, 2, 0], [2, 2, 1]]
    assert outs[0]["seen"] == outs[1]["seen"] == want_seen
    assert outs[0]["w"] == outs[1]["w"]  # every rank applied the same updates
    base = np.arange(8, dtype=np.float64)
    for it, micro in (("0", [0, 1, 2]), ("1", [3, 4]), ("2", [5, 6])):
        # both ranks' micro-gradients summed, divided by ranks × k
        total = sum(base * (t + 1) * 2 + 100 for t in micro)
        np.testing.assert_allclose(outs[0]["pushed"][it], total / (2 * len(micro)), rtol=1e-6)
