"""Local steps with and without ADJUST_LR, end to end: the emulated-straggler demo (one persistently slowed
site, real gateway daemons, a real ``wanrt scheduler`` with policy ``stragglers``, gloo trainers), the same
trainers trained once per arm against fresh daemons:

* ``off`` — mitigation off (fixed settings);
* ``adjust_bs`` — the straggler policy's default ADJUST_BS (AntDT Eq. 3);
* ``local_steps`` — ZipLine local steps, learning rate not scaled (``lr_scaling = "none"``);
* ``local_steps_linear`` — local steps with ``lr_scale`` = S / S_base (STAR §IV-C, Goyal et al. 2017);
* ``local_steps_sqrt`` — local steps with ``lr_scale`` = √(S / S_base).

S = Σ_s k_s·b_s·ranks_s is the samples of one WAN iteration, S_base the same at k = 1 (docs/local_steps.md).
Reported per arm: time to the loss target, WAN iterations to it, the ``lr_scale`` and k's committed, and
each arm's time to target as a ratio to the baseline arm's in the same run (``off``, or the first arm run
when ``off`` is not). Every run uses the demo's quick size (2 sites × 1 rank, site b slowed). ``--quick``
(< 60 s): one repeat (seed 0) of two arms, ``local_steps`` and ``local_steps_sqrt`` (the baseline is then
local steps at the user's rate); without it, every arm, two repeats (seeds 0 and 1). Times depend on the
load of the machine (printed with the table): compare arms of one run, not runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# this checkout's packages before an installed copy: the trainers (spawned, they inherit sys.path) must run
# the same code as the daemons (PYTHONPATH, set in main)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_straggler_demo import _config

import wanrt
from wanrt.demo.runner import Demo

__all__ = ["ARMS", "QUICK_ARMS", "main", "run_arms"]

#: arm → the ``[scheduler.stragglers.local_steps]`` table of its mitigated run (None: mitigation off;
#: {}: the policy's default ADJUST_BS)
ARMS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "adjust_bs": {},
    "local_steps": {"enabled": True, "lr_scaling": "none"},
    "local_steps_linear": {"enabled": True, "lr_scaling": "linear"},
    "local_steps_sqrt": {"enabled": True, "lr_scaling": "sqrt"},
}
#: ``--quick``: the question this tool adds (does a rate rule change local steps' time to target?) in 2 arms
QUICK_ARMS: tuple[str, ...] = ("local_steps", "local_steps_sqrt")


@contextmanager
def _local_steps_table(table: Mapping[str, Any]) -> Iterator[None]:
    """The mitigated run's scheduler config with ``table`` as its ``[...stragglers.local_steps]``."""
    orig = Demo.__dict__["straggler_tables"]
    base = Demo.straggler_tables

    def tables(c: Any) -> dict[str, dict[str, Any]]:
        out = base(c)
        if table:
            out["local_steps"] = dict(table)
        return out

    setattr(Demo, "straggler_tables", staticmethod(tables))  # noqa: B010 (a method, not an attribute)
    try:
        yield
    finally:
        setattr(Demo, "straggler_tables", orig)  # noqa: B010


def run_arms(
    arms: Sequence[str], seed: int, out: Path, quick: bool, changes: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """Each arm once on one set of trainers; what each reached and what the scheduler committed.
    ``changes``: DemoConfig fields other than the benchmark's (the user's ``lr``, ``max_iters``)."""
    cfg = dataclasses.replace(_config(quick, seed), **dict(changes or {}))
    rows: dict[str, dict[str, Any]] = {}
    with Demo(cfg, out / f"seed{seed}", progress=False, on_line=lambda _line: None) as demo:
        for arm in arms:
            table = ARMS[arm]
            with _local_steps_table(table or {}):
                r = demo.run("wanrt" if table is None else "mitigated", label=arm)
            commits = [dict(d.values or {}) for d in r.commits]
            ks = {k: v for c in commits for k, v in c.items() if k.startswith("local_steps@")}
            scales = [c["lr_scale"] for c in commits if "lr_scale" in c]
            rows[arm] = {
                "tta_s": r.tta_s,
                "iters_to_target": r.iters_to_target,
                "iterations": r.iterations,
                "iters_per_s": r.iters_per_s,
                "final_loss": r.final_loss,
                "distinct_final_models": r.distinct_final_models,
                "lr_scales": scales,
                "local_steps": ks,
                "batches": {k: v for c in commits for k, v in c.items() if k.startswith("batch_size@")},
                "commits": len(commits),
                "first_effective_iteration": min(
                    (d.effective_iteration for d in r.commits if d.effective_iteration is not None),
                    default=None,
                ),
                "curve": [(p.iteration, round(p.loss, 4)) for p in r.curve],
            }
    return rows


def _f(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    # the daemons (``python -m wanrt`` subprocesses) too, wherever this is started from
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one repeat (seed 0) of two arms (< 60 s)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), help="default: all (--quick: QUICK_ARMS)")
    ap.add_argument("--seeds", nargs="+", type=int, help="override the repeats' seeds")
    ap.add_argument("--out", type=Path, help="run directories (default: a temporary one)")
    ap.add_argument("--lr", type=float, help="the user's learning rate (default: the demo's, SGD 0.3)")
    ap.add_argument("--max-iters", type=int, help="iteration cap of every run (default: the demo's)")
    args = ap.parse_args(argv)
    seeds = args.seeds or ([0] if args.quick else [0, 1])
    arms = args.arms or list(QUICK_ARMS if args.quick else ARMS)
    baseline = "off" if "off" in arms else arms[0]
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-local-steps-lr-"))
    print(f"wanrt from {Path(wanrt.__file__).parent}; runs in {out}")
    load_before = os.getloadavg()
    changes: dict[str, Any] = {}
    if args.lr is not None:
        changes["lr"] = args.lr
    if args.max_iters is not None:
        changes["max_iters"] = args.max_iters
    per_seed = {seed: run_arms(arms, seed, out, True, changes) for seed in seeds}
    load_after = os.getloadavg()
    print(
        f"\nemulated straggler (quick demo size), seeds {seeds}, "
        f"load {load_before[0]:.2f} → {load_after[0]:.2f}"
    )
    print(
        f"{'seed':>4} {'arm':<20} {'TTA s':>7} {'× base':>6} {'WAN it':>7} {'it/s':>6} "
        f"{'final loss':>10}  lr_scale / k's"
    )
    summary: dict[str, dict[str, Any]] = {}
    for seed, rows in per_seed.items():
        base = rows[baseline]["tta_s"]
        for arm, r in rows.items():
            ratio = base / r["tta_s"] if base and r["tta_s"] else None
            r["tta_gain_vs_baseline"] = ratio
            what = r["lr_scales"][-1:] or r["batches"] or ""
            print(
                f"{seed:>4} {arm:<20} {_f(r['tta_s']):>7} {_f(ratio, 2):>6} {r['iters_to_target'] or '—':>7} "
                f"{r['iters_per_s']:>6.2f} {r['final_loss']:>10.4f}  {what} {r['local_steps'] or ''}"
            )
    for arm in arms:
        ttas = [rows[arm]["tta_s"] for rows in per_seed.values()]
        its = [rows[arm]["iters_to_target"] for rows in per_seed.values()]
        reached = [t for t in ttas if t is not None]
        summary[arm] = {
            "tta_s_mean": statistics.mean(reached) if len(reached) == len(ttas) else None,
            "iters_to_target_mean": statistics.mean(i for i in its if i is not None)
            if all(i is not None for i in its)
            else None,
        }
    result = {
        "local_steps_lr_arms": summary,
        "local_steps_lr_per_seed": {str(s): rows for s, rows in per_seed.items()},
        "local_steps_lr_setup": {
            "seeds": seeds,
            "baseline": baseline,
            "changes": changes,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "out_dir": str(out),
            "wanrt": str(Path(wanrt.__file__).parent),
        },
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
