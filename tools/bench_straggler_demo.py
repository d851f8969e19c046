"""``emulated_straggler_tta_gain``: the demo with one persistently slowed site, straggler mitigation off
over on, on real gateway daemons, a real ``wanrt scheduler`` (policy ``stragglers``) and gloo trainers.

Called by tools/bench_stragglers.py (its emulated part; docs/stragglers.md). Each seed boots one set of
trainers (:class:`wanrt.demo.Demo`) and trains twice against fresh daemons with the same slowed site: the
fixed-setting wanrt run (mitigation off) and the ``mitigated`` run (the scheduler detects the persistent
straggler on AntDT's two windows and announces Eq. 3's batch split). No bandwidth trace: the only
disturbance is the straggler. The key is the ratio of the mean time-to-target over the seeds, off / on.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import Any

from wanrt.demo.config import QUICK, DemoConfig
from wanrt.demo.straggler import StragglerSpec
from wanrt.demo.straggler_results import StragglerComparison

__all__ = ["emulated_straggler"]


def _config(quick: bool, seed: int) -> DemoConfig:
    """Quick: the demo's ``--quick`` size (2 sites × 1 rank), site b slowed. Full: the default demo
    (3 sites × 2 ranks), site c slowed. Intensity 0.8 as AntDT's headline experiments (§VII-B1)."""
    base = QUICK if quick else DemoConfig()  # the pre-issue-25 default (width 512) its numbers describe
    site = "b" if quick else "c"
    return dataclasses.replace(
        base,
        fluctuating=False,
        scheduler=False,
        seed=seed,
        straggler=StragglerSpec(site, 0.8, persistent=True),
    )


def emulated_straggler(quick: bool, out_dir: Path | None = None) -> dict[str, Any]:
    """Run the comparison for one seed (quick) or two (full); print a table; return the keys."""
    seeds = (0,) if quick else (0, 1)
    root = out_dir or Path(tempfile.mkdtemp(prefix="bench-straggler-demo-"))
    from wanrt.demo.runner import Demo

    rows: list[StragglerComparison] = []
    cfg = _config(quick, seeds[0])
    for seed in seeds:
        cfg = _config(quick, seed)
        with Demo(cfg, root / f"seed{seed}", progress=False, on_line=lambda _line: None) as demo:
            off = demo.run("wanrt")
            on = demo.run("mitigated")
        rows.append(StragglerComparison(str(cfg.straggler), off, on))
    print(
        f"\nemulated straggler: {cfg.sites} sites × {cfg.ranks} ranks, straggler {cfg.straggler} "
        f"(+{cfg.straggler_sleep_s * 0.8:.2f} s per iteration at {cfg.batch} samples/rank), "
        f"target loss {cfg.target_loss:g}"
    )
    print(
        f"{'seed':>4} {'off TTA s':>10} {'on TTA s':>9} {'gain':>6} {'off it':>7} {'on it':>6} "
        f"{'off it/s':>9} {'on it/s':>8} {'1st adjust s':>12}  batches (end, on)"
    )
    for seed, c in zip(seeds, rows, strict=True):
        adj = c.first_adjust_s()
        print(
            f"{seed:>4} {_f(c.off.tta_s):>10} {_f(c.on.tta_s):>9} {_f(c.tta_gain, 2):>6} "
            f"{_i(c.off.iters_to_target):>7} {_i(c.on.iters_to_target):>6} {c.off.iters_per_s:>9.2f} "
            f"{c.on.iters_per_s:>8.2f} {_f(adj):>12}  {dict(sorted(c.on.final_batch.items()))}"
        )
    offs = [c.off.tta_s for c in rows]
    ons = [c.on.tta_s for c in rows]
    reached = all(t is not None for t in offs + ons)
    gain = None
    if reached:
        gain = statistics.mean(t for t in offs if t is not None) / statistics.mean(
            t for t in ons if t is not None
        )
    off_its = [c.off.iters_to_target for c in rows]
    on_its = [c.on.iters_to_target for c in rows]
    its_ratio = None
    if all(i is not None for i in off_its + on_its):
        its_ratio = statistics.mean(i for i in on_its if i is not None) / statistics.mean(
            i for i in off_its if i is not None
        )
    print(f"emulated_straggler_tta_gain (mean off TTA / mean on TTA): {_f(gain, 2)}")
    return {
        "emulated_straggler_tta_gain": gain,
        "emulated_straggler_iters_ratio": its_ratio,
        "emulated_straggler_per_seed": [
            {
                "seed": seed,
                "tta_off_s": c.off.tta_s,
                "tta_on_s": c.on.tta_s,
                "gain": c.tta_gain,
                "iters_off": c.off.iters_to_target,
                "iters_on": c.on.iters_to_target,
                "iters_per_s_off": c.off.iters_per_s,
                "iters_per_s_on": c.on.iters_per_s,
                "first_adjust_s": c.first_adjust_s(),
                "final_batch_on": dict(c.on.final_batch),
                "decisions_on": len(c.on.commits),
            }
            for seed, c in zip(seeds, rows, strict=True)
        ],
        "emulated_straggler_setup": {
            "sites": cfg.sites,
            "ranks": cfg.ranks,
            "straggler": str(cfg.straggler),
            "sleep_s": cfg.straggler_sleep_s,
            "target_loss": cfg.target_loss,
            "seeds": list(seeds),
            "out_dir": str(root),
        },
    }


def _f(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _i(v: int | None) -> str:
    return "—" if v is None else str(v)
