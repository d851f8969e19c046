"""``wanrt profile``: run Algorithm 1 on the demo model and write the convergence profile as JSON.

::

    wanrt profile --out profile.json                 # 30 probes, about a minute on two cores
    wanrt profile --out profile.json --quick         # smaller probes: seconds
    wanrt profile --out profile.json --config job.toml --probes 20

``--config`` reads the ``[profile]`` table of a TOML file (:class:`ProfileConfig`, with a nested
``[profile.probe]``); flags override it. The scheduler loads the file with ``ConvergenceProfile.load(path)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from scheduler.profile.config import QUICK, SECTION, ProfileConfig
from wanrt.config import from_mapping, load_toml
from wanrt.errors import ConfigError

__all__ = ["add_arguments", "config_from_args", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="where to write the profile (JSON)")
    p.add_argument(
        "--probes", type=int, help=f"Bayesian-optimisation steps N (default {ProfileConfig().probes})"
    )
    p.add_argument("--quick", action="store_true", help="small probes (a 64-wide MLP, two epochs): seconds")
    p.add_argument("--config", help="TOML file whose [profile] table sets the profile's settings")
    p.add_argument("--seed", type=int, help="seed of the r draws, the model and the sample stream")
    p.add_argument("--samples", type=int, help="training samples per probe")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    """``--quick`` or the defaults, then ``--config``'s table, then the flags; errors name the flag or key."""
    cfg = QUICK if args.quick else ProfileConfig()
    if args.config:
        table = load_toml(args.config).get(SECTION, {})
        base = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        base["probe"] = dataclasses.asdict(cfg.probe)
        merged = {**base, **{k: v for k, v in table.items() if k != "probe"}}
        merged["probe"] = {**base["probe"], **table.get("probe", {})}
        cfg = from_mapping(ProfileConfig, merged, section=SECTION)
    try:
        if args.probes is not None:
            cfg = dataclasses.replace(cfg, probes=args.probes, init_probes=min(cfg.init_probes, args.probes))
        if args.seed is not None:
            cfg = dataclasses.replace(
                cfg, seed=args.seed, probe=dataclasses.replace(cfg.probe, seed=args.seed)
            )
        if args.samples is not None:
            cfg = dataclasses.replace(cfg, probe=dataclasses.replace(cfg.probe, samples=args.samples))
    except ConfigError as exc:
        flag = {"probes": "--probes", "init_probes": "--probes", "seed": "--seed", "samples": "--samples"}
        key = str(exc.fields.get("key"))
        raise ConfigError(exc.message, key=flag.get(key, key), value=exc.fields.get("value")) from None
    return cfg


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from scheduler.profile.bayesopt import ProbeRecord, run_profile
    from wanrt.demo.digits_probe import DigitsProbe

    cfg = config_from_args(args)
    out = Path(args.out)
    if not out.parent.exists():
        raise ConfigError(f"directory of --out does not exist: {out.parent}", key="--out", value=str(out))
    probe = DigitsProbe(cfg.probe)
    total = cfg.probes + 1 + int(cfg.measure_staleness)
    bar: Any = tqdm(total=total, desc="probes", unit="probe", disable=not args.progress, file=sys.stderr)

    def tick(rec: ProbeRecord) -> None:
        bar.set_postfix(r=f"{rec.r:.4f}", x=rec.total_batch, loss=f"{rec.loss:.3f}", refresh=False)
        bar.update(1)

    try:
        result = run_profile(probe.loss, cfg, describe=probe.describe(), on_probe=tick)
    finally:
        bar.close()
    result.profile.save(out)
    best = min(result.records[1:], key=lambda rec: rec.loss) if len(result.records) > 1 else None
    print(
        f"wrote {out}: {result.probes} probes, baseline loss {result.profile.baseline_loss:.4f} "
        f"at batch {result.profile.baseline_batch}",
        end="",
    )
    if result.profile.staleness is not None:
        print(f", staleness penalty {result.profile.staleness:+.4f}", end="")
    if best is not None:
        print(f"; best probe r={best.r:.4f} x={best.total_batch} loss {best.loss:.4f}", end="")
    print()
    return 0
