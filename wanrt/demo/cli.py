"""``wanrt demo``: flags, the runs (dense, wanrt fixed, wanrt adaptive), the printed summary, the plot, JSON.

Every flag defaults to ``None`` so :func:`~wanrt.demo.config.config_from_args` can tell "not given" (keep
the preset's value, ``--quick`` or the default) from a value the user typed; validation happens there, so a
bad flag is reported before any process starts, with the flag's name.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from gateways.rounds.topology import TOPOLOGY_KINDS
from wanrt.demo.config import DEFAULT, OPTIMIZERS, DemoConfig, check_device, config_from_args
from wanrt.demo.ddp_option import ENABLE_HINT, add_ddp_argument, ddp_setup
from wanrt.demo.ddp_results import ddp_headline, ddp_json, format_ddp_table
from wanrt.demo.mode_results import format_mode_table, mode_rows, modes_json
from wanrt.demo.plot import plot_loss_vs_time
from wanrt.demo.profile_cache import CachedProfile
from wanrt.demo.results import RunResult, compare, format_table, write_json
from wanrt.demo.runner import Demo, Mode
from wanrt.demo.straggler_results import StragglerComparison, format_straggler_table

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small fast configuration (CI): 2 sites × 1 rank")
    p.add_argument("--sites", type=int, help=f"number of sites (default {DEFAULT.sites})")
    p.add_argument("--ranks", type=int, help=f"trainer processes per site (default {DEFAULT.ranks})")
    p.add_argument(
        "--bandwidth",
        help=f"rate of every WAN link, e.g. 100M, 1.5Gbit (default {DEFAULT.bandwidth_bps / 1e6:g}M)",
    )
    p.add_argument(
        "--rtt", help=f"round-trip time between sites, e.g. 40ms (default {DEFAULT.rtt_s * 1e3:g}ms)"
    )
    p.add_argument(
        "--dense-budget",
        dest="dense_budget",
        help="stop the dense arm after this much training, e.g. 60s; its speedup is then a lower bound "
        f"(default {DEFAULT.dense_budget_s:g}s, 0: none)",
    )
    p.add_argument(
        "--trace-step",
        dest="trace_step",
        help=f"how long the fluctuating link holds each rate, e.g. 5s (default {DEFAULT.trace_step_s:g}s)",
    )
    p.add_argument(
        "--fluctuating",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="put the last site on a fluctuating bandwidth trace (default on)",
    )
    p.add_argument(
        "--model-hidden",
        dest="model_hidden",
        type=int,
        help=f"MLP hidden width (default {DEFAULT.model_hidden})",
    )
    p.add_argument(
        "--topology", choices=TOPOLOGY_KINDS, help=f"WAN round topology (default {DEFAULT.topology})"
    )
    p.add_argument(
        "--density",
        type=float,
        help=f"wanrt's fraction of gradient elements sent (default {DEFAULT.density:g})",
    )
    p.add_argument(
        "--mode",
        help="compare the dense baseline with wanrt in these exchange modes, comma-separated: per-step, "
        "diloco (wanrt.DiLoCo: --outer-steps inner steps per exchange), streaming (Streaming DiLoCo: "
        "--outer-fragments fragments in turn), auto (the scheduler chooses the mode and H from the measured "
        "link; docs/scheduler.md). Default: the dense / wanrt / scheduler arms",
    )
    p.add_argument(
        "--outer-steps",
        dest="outer_steps",
        type=int,
        help=f"the diloco arm's H, and the auto arm's start (default {DEFAULT.outer_steps})",
    )
    p.add_argument(
        "--outer-fragments",
        dest="outer_fragments",
        type=int,
        help=f"the streaming arm's fragments P, dividing H (default {DEFAULT.outer_fragments})",
    )
    p.add_argument(
        "--staleness", type=int, help=f"wanrt's partial-staleness bound (default {DEFAULT.staleness})"
    )
    p.add_argument(
        "--optimizer", choices=OPTIMIZERS, help=f"sparse optimizer of both runs (default {DEFAULT.optimizer})"
    )
    p.add_argument(
        "--lr",
        type=float,
        help=f"learning rate (default {DEFAULT.lr:g}; with --optimizer, that optimizer's usual value)",
    )
    p.add_argument("--batch", type=int, help=f"samples per rank and iteration (default {DEFAULT.batch})")
    p.add_argument(
        "--scheduler",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also train with the job's scheduler deciding density, batch sizes and staleness "
        "(default on; --no-scheduler: the dense and the fixed wanrt run only)",
    )
    p.add_argument(
        "--profile",
        metavar="JSON|auto|none",
        help="the scheduler's convergence profile: a file from `wanrt profile`; auto: a profile of the "
        "demo's own workload, computed on first use (about a minute) and cached; none (default): the "
        "analytic stand-in",
    )
    p.add_argument(
        "--target-loss",
        dest="target_loss",
        type=float,
        help=f"stop at this training loss (default {DEFAULT.target_loss:g})",
    )
    p.add_argument(
        "--max-iters",
        dest="max_iters",
        type=int,
        help=f"stop after this many iterations anyway (default {DEFAULT.max_iters})",
    )
    p.add_argument(
        "--eval-every",
        dest="eval_every",
        type=int,
        help=f"evaluate the loss every N iterations (default {DEFAULT.eval_every})",
    )
    p.add_argument(
        "--seed", type=int, help=f"data split, initial model, batches and trace (default {DEFAULT.seed})"
    )
    p.add_argument(
        "--straggler",
        metavar="SITE:INTENSITY[:persistent]",
        help="slow SITE's trainers as AntDT's evaluation does (delay = SleepDuration × INTENSITY per "
        "iteration, per sample processed; half of every period, or the whole run with :persistent) and "
        "compare the run with the scheduler's straggler mitigation off and on, e.g. c:0.8:persistent",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where the trainers compute (default cpu); cuda: one rank per site per GPU, sites may share "
        "a GPU, the leaders select on the GPU",
    )
    p.add_argument("--out", help="directory for logs, configs, plot and results (default: a new temp dir)")
    p.add_argument("--json", help="also write the results JSON here")
    p.add_argument("--no-progress", dest="no_progress", action="store_true", help="no progress bars")
    add_ddp_argument(p)


def _describe(cfg: DemoConfig, parameters: int, sep: str = "; ") -> str:
    trace = f", site {chr(ord('a') + cfg.sites - 1)} on a fluctuating trace" if cfg.fluctuating else ""
    return (
        f"{cfg.sites} sites × {cfg.ranks} ranks, {cfg.bandwidth_bps / 1e6:g} Mbit/s links, "
        f"{cfg.rtt_s * 1e3:g} ms RTT{trace}, {cfg.topology} topology{sep}"
        f"MLP {parameters / 1e6:.2f} M params, wanrt density {cfg.density:g}, "
        f"staleness {cfg.staleness}, target loss {cfg.target_loss:g}"
        + (", adaptive: the scheduler decides" if cfg.scheduler else "")
    )


def profile_line(cfg: DemoConfig, made: CachedProfile | None) -> str:
    """Which ḡ the adaptive run's scheduler had, and what it cost: apart from every time to target."""
    if made is not None:
        cost = "from the cache" if made.cached else f"computed in {made.seconds:.1f} s ({made.probes} probes)"
        return (
            f"convergence profile of this workload: {made.path}, {cost}; like StellaTrain's offline profile "
            "(§4.3) it is not counted in any time to target"
        )
    if cfg.profile is not None:
        return f"convergence profile: {cfg.profile} (--profile)"
    return "convergence profile: the scheduler's analytic stand-in (--profile auto: one of this workload)"


def run(args: argparse.Namespace) -> int:
    if getattr(args, "ddp", False) and getattr(args, "straggler", None):
        print("wanrt demo: error: --ddp and --straggler are separate comparisons; give one", file=sys.stderr)
        return 1
    cfg = config_from_args(args)
    check_device(cfg)
    if getattr(args, "ddp", False) and cfg.device == "cuda":
        print(
            "wanrt demo: error: the DDP arm runs on CPU only; drop --ddp to use --device cuda",
            file=sys.stderr,
        )
        return 1
    # absolute: the configs written under it are read by daemons relative to their own directory
    out = (Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="wanrt-demo-out-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"wanrt demo: output in {out}", flush=True)
    if cfg.straggler is not None:
        return _run_straggler(cfg, out, args)
    if cfg.modes:
        return _run_modes(cfg, out, args)
    ddp = None
    try:
        with (
            ddp_setup(args, cfg, out) as setup,
            Demo(setup.cfg, out, progress=not args.no_progress, netns=setup.net) as demo,
        ):
            cfg = setup.cfg
            print(_describe(cfg, demo.parameters), flush=True)
            ddp = setup.job.run().result if setup.job is not None else None
            dense = demo.run("dense")
            wanrt = demo.run("wanrt")
            adaptive = demo.run("adaptive") if cfg.scheduler else None
            replay = demo.replay_dense(dense)
            parameters = demo.parameters
            made = demo.profile
    except KeyboardInterrupt:
        print(f"\nwanrt demo: interrupted; every child process was stopped (logs in {out})", file=sys.stderr)
        return 130
    c = compare(dense, wanrt, adaptive, replay)
    print()
    if ddp is not None:
        print(ddp_headline(ddp, c))
        print(format_ddp_table(ddp, c))
        print()
    print(format_table(c))
    if adaptive is not None:
        print(profile_line(cfg, made))
    if ddp is None:
        print(f"\n({ENABLE_HINT})")
    png = plot_loss_vs_time(c, out / "loss_vs_time.png", title=_describe(cfg, parameters, "\n"))
    print(f"\nplot: {png}")
    data = c.to_json(
        {
            "config": dataclasses.asdict(cfg),
            "parameters": parameters,
            "plot": str(png),
            "out_dir": str(out),
            "profile": None if made is None else {**dataclasses.asdict(made), "path": str(made.path)},
        }
    )
    if ddp is not None:
        data.update(ddp_json(ddp, c))
    write_json(out / "results.json", data)
    if args.json:
        write_json(Path(args.json), data)
    print(f"results: {out / 'results.json'}" + (f" and {args.json}" if args.json else ""))
    for r in c.arms:
        if not r.reached and r.budget_s is not None:
            print(
                f"note: the {r.mode} run stopped at its --dense-budget of {r.budget_s:g} s after "
                f"{r.iterations} iterations, before reaching loss {cfg.target_loss:g} (final "
                f"{r.final_loss:.3f}): its speedup is a lower bound",
                file=sys.stderr,
            )
            if r is c.dense and replay is not None:
                print(
                    "note: its iterations to the target were counted in a replay on unshaped links "
                    "(staleness 0: the link changes only the time): "
                    + (
                        f"{replay.iters_to_target} iterations"
                        if replay.reached
                        else f"not reached in {replay.iterations} (dense_replay_max_iters)"
                    ),
                    file=sys.stderr,
                )
        elif not r.reached:
            print(
                f"note: the {r.mode} run stopped at --max-iters {r.iterations} before reaching loss "
                f"{cfg.target_loss:g} (final {r.final_loss:.3f}); raise --max-iters or the target",
                file=sys.stderr,
            )
    return 0


#: ``--mode`` → the runner's mode of that arm (per-step exchange is the demo's fixed-setting wanrt run)
_ARM_OF: dict[str, Mode] = {"per-step": "wanrt", "diloco": "diloco", "auto": "auto", "streaming": "streaming"}


def _run_modes(cfg: DemoConfig, out: Path, args: argparse.Namespace) -> int:
    """``--mode``: the dense baseline, then wanrt in each mode given; a row per mode (docs/demo.md)."""
    try:
        with Demo(cfg, out, progress=not args.no_progress) as demo:
            print(_describe(dataclasses.replace(cfg, scheduler=False), demo.parameters), flush=True)
            dense = demo.run("dense")
            runs: dict[str, RunResult] = {m: demo.run(_ARM_OF[m], label=m) for m in cfg.modes}
    except KeyboardInterrupt:
        print(f"\nwanrt demo: interrupted; every child process was stopped (logs in {out})", file=sys.stderr)
        return 130
    rows = mode_rows(dense, runs)
    print()
    print(format_mode_table(rows))
    data = modes_json(rows, {"config": dataclasses.asdict(cfg), "out_dir": str(out)})
    write_json(out / "results.json", data)
    if args.json:
        write_json(Path(args.json), data)
    print(f"results: {out / 'results.json'}" + (f" and {args.json}" if args.json else ""))
    return 0


def _run_straggler(cfg: DemoConfig, out: Path, args: argparse.Namespace) -> int:
    """``--straggler``: the fixed-setting wanrt run with the slowed site, mitigation off, then the same
    with the job's scheduler running the straggler policy (ADJUST_BS, docs/stragglers.md)."""
    assert cfg.straggler is not None
    spec = cfg.straggler
    try:
        with Demo(cfg, out, progress=not args.no_progress) as demo:
            print(
                _describe(dataclasses.replace(cfg, scheduler=False), demo.parameters)
                + f"; straggler {spec}: +{cfg.straggler_sleep_s * spec.intensity:.3g} s per iteration "
                f"at {cfg.batch} samples/rank"
                + ("" if spec.persistent else f", first half of every {cfg.straggler_period_s:g} s"),
                flush=True,
            )
            off = demo.run("wanrt")
            on = demo.run("mitigated")
    except KeyboardInterrupt:
        print(f"\nwanrt demo: interrupted; every child process was stopped (logs in {out})", file=sys.stderr)
        return 130
    c = StragglerComparison(str(spec), off, on)
    print()
    print(format_straggler_table(c))
    data = c.to_json({"config": dataclasses.asdict(cfg), "out_dir": str(out)})
    write_json(out / "results.json", data)
    if args.json:
        write_json(Path(args.json), data)
    print(f"results: {out / 'results.json'}" + (f" and {args.json}" if args.json else ""))
    for r in (off, on):
        if not r.reached:
            print(
                f"note: the {r.mode} run stopped at --max-iters {r.iterations} before reaching loss "
                f"{cfg.target_loss:g}; raise --max-iters or the target",
                file=sys.stderr,
            )
    return 0
