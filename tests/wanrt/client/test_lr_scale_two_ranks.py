"""The job's ``lr_scale`` on a site of two gloo ranks: announced to the leader only, it reaches the other
rank with the site's decision and applies at the same WAN iteration on both (with a change of local steps
in the same announcement), so both ranks step with ``lr × lr_scale`` and end with the same parameters."""

from __future__ import annotations

import numpy as np

from tests.wanrt.client.gloo_ranks import run_gloo_ranks

SCRIPT = """
import json, sys, torch, wanrt
from tests.wanrt.client.fake_link import scripted
from wanrt.client.site.decision import ConfigChange
rank = int(sys.argv[1])
links = []
cfg = wanrt.ClientConfig.dense_baseline(staleness=0, update_deadline_s=20.0)
ctx = wanrt.client.init("mem://gw", site="a", job="j", secret=b"0123456789abcdef-secret", config=cfg,
                        link_factory=scripted({}, links))
w = torch.nn.Parameter(torch.zeros(8))
opt = wanrt.SparseOptimizer([("w", w)], "sgd", lr=0.5, ctx=ctx)
if links:
    links[0].announce(ConfigChange(effective_iteration=2, local_steps=2, lr_scale=3.0))
seen, ws = [], []
for t in range(6):  # iterations 0 and 1: one step each at scale 1; iterations 2 and 3: 2 micro-steps at 3
    seen.append([ctx.iteration, ctx.local_steps, ctx.lr_scale])
    c = torch.arange(8, dtype=torch.float32) * (t + 1) + 100 * rank
    (w * c).sum().backward()
    opt.step()
    opt.zero_grad()
    ws.append(w.detach().tolist())
pushed = {f"{it}": p.to_dense().tolist() for it, layer, p in links[0].pushed} if links else {}
print(json.dumps({"seen": seen, "w": ws, "pushed": pushed}))
ctx.close()
"""


def test_two_ranks_switch_the_scale_at_the_same_wan_iteration() -> None:
    outs = run_gloo_ranks(SCRIPT)
    want_seen = [[0, 1, 1.0], [1, 1, 1.0], [2, 2, 3.0], [2, 2, 3.0], [3, 2, 3.0], [3, 2, 3.0]]
    assert outs[0]["seen"] == outs[1]["seen"] == want_seen
    assert outs[0]["w"] == outs[1]["w"]  # every rank applied the same updates at the same scale
    pushed = outs[0]["pushed"]
    # the parameters after each WAN iteration: minus 0.5 × scale × the site's push (echoed back)
    want = np.zeros(8)
    for it, scale, step in (("0", 1.0, 0), ("1", 1.0, 1), ("2", 3.0, 3), ("3", 3.0, 5)):
        want -= 0.5 * scale * np.asarray(pushed[it])
        np.testing.assert_allclose(outs[0]["w"][step], want, rtol=1e-5)
