"""KILL_RESTART end to end, measured (issue 10, docs/kill_restart.md).

Runs the job of ``tests/scheduler/service/test_kill_restart_e2e.py`` — a real scheduler daemon
(``kill_restart = true``), two real gateway daemons, each site's trainers under real torchrun — where one
rank of site a sleeps 0.3 s inside every batch of its first start (a bad node that a restart replaces by
a good one), and reports from the run's own records (the scheduler's decisions file, the trainers' JSON,
all on this host's monotonic clock):

* ``order_to_exit_s`` — the order's commit to the old process leaving (RestartRequested) at its iteration;
* ``exit_to_restart_s`` — that exit to the new process training again (torchrun's restart, Python and
  torch start-up, the process group, the gateway handshake);
* ``restart_to_params_s`` — to the job's parameters installed (the parameter resync);
* ``order_to_rejoin_s`` — the whole path, commit to parameters in;
* ``it_s_with_bad_node`` / ``it_s_after_restart`` and their ratio ``speedup``: the job's iteration time
  (site b's, which runs throughout) while the bad node held it back, and once the replacement had the
  job's parameters — side by side in the same run;
* ``params_equal`` (1 when both sites ended with the same parameters, bit for bit), ``orders`` (restart
  orders committed: 1), ``rounds_lost`` (rounds of the job site b's gateway did not finish: 0).

``--quick`` runs the one-rank-per-site shape once (≈ 15 s); the full run adds the shape with two ranks at
site a (the slow one among them) and repeats each twice. ``--json PATH`` writes the keys per run and the
medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.harness.kill_restart_scenario import STEPS, Run, run_scenario

KEYS = (
    "order_to_exit_s",
    "exit_to_restart_s",
    "restart_to_params_s",
    "order_to_rejoin_s",
    "it_s_with_bad_node",
    "it_s_after_restart",
    "speedup",
    "params_equal",
    "orders",
    "rounds_lost",
)


def facts(run: Run, nproc_a: int) -> dict[str, Any]:
    """The keys of one run, each computed from that run's records."""
    r = run.results
    if run.codes != {"a": 0, "b": 0} or len(run.restarts) < 1:
        return {"failed": True, "codes": run.codes, "restarts": run.restarts, "log": run.logs[-1500:]}
    effective = run.restarts[0]["effective_iteration"]
    commit = next(
        x["monotonic"] for x in run.decisions if x["kind"] == "commit" and "restart@a" in x.get("values", {})
    )
    old = [r[f"a{k}-0"] for k in range(nproc_a)]
    new = [r[f"a{k}-1"] for k in range(nproc_a)]
    exit_t = max(x["t_exit"] for x in old)
    start_t = max(x["t_start"] for x in new)
    params_t = max(x["t_params"] for x in new)
    b = r["b0-0"]
    ends = b["step_ends"]  # ends[i]: iteration i finished at site b
    slow = [ends[i] - ends[i - 1] for i in range(5, effective - 1)]
    after_from = next(i for i, t in enumerate(ends) if t >= params_t) + 5
    fast = [ends[i] - ends[i - 1] for i in range(after_from, len(ends))]
    it_slow, it_fast = statistics.mean(slow), statistics.mean(fast)
    return {
        "order_iteration": effective,
        "order_to_exit_s": exit_t - commit,
        "exit_to_restart_s": start_t - exit_t,
        "restart_to_params_s": params_t - start_t,
        "order_to_rejoin_s": params_t - commit,
        "it_s_with_bad_node": it_slow,
        "it_s_after_restart": it_fast,
        "speedup": it_slow / it_fast,
        "params_equal": int(all(x["digest"] == b["digest"] for x in new)),
        "orders": len(run.restarts),
        "rounds_lost": STEPS - 1 - run.frontier_b,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run, one rank per site (< 60 s)")
    ap.add_argument("--json", type=Path, help="write the keys here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the daemons' warnings (the restart itself) bury the table
    shapes = [("1 rank/site", 1, 0)] if args.quick else [("1 rank/site", 1, 0), ("2 ranks at a", 2, 1)]
    repeats = 1 if args.quick else 2
    rows: list[dict[str, Any]] = []
    for name, nproc, slow_rank in shapes:
        for k in range(repeats):
            with tempfile.TemporaryDirectory(prefix="krbench") as d:
                run = asyncio.run(run_scenario(Path(d), nproc, slow_rank))
                rows.append({"shape": name, "repeat": k, **facts(run, nproc)})
    load = os.getloadavg()[0]
    print(f"KILL_RESTART end to end ({'quick' if args.quick else 'full'}; load {load:.1f})")
    cols = ("shape", "order_iteration", *KEYS)
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(_fmt(row.get(c)) for c in cols))
    good = [x for x in rows if not x.get("failed")]
    summary = {key: statistics.median(x[key] for x in good) for key in KEYS} if good else {}
    summary["runs"], summary["failed_runs"] = len(rows), len(rows) - len(good)
    print("median: " + ", ".join(f"{k} {_fmt(v)}" for k, v in summary.items()))
    if args.json is not None:
        args.json.write_text(json.dumps({"load": load, "runs": rows, **summary}, indent=2, default=str))
    return 0 if good and len(good) == len(rows) else 1


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    sys.exit(main())
