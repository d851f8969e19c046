"""The demo's own convergence profile: Algorithm 1 (StellaTrain §4.3) on the workload the demo trains, cached.

StellaTrain profiles ḡ(r, Σx) offline, once per model, before training; the scheduler's analytic stand-in
(``PowerLawConvergence``) says large batches cost little, which on the demo's MLP is wrong (a total batch of
768 reaches a loss 14× the batch-192 one after the same samples), so the adaptive arm picked 4× the fixed
arm's batch and needed as many iterations. The profile here is measured on the demo's model (its width),
its data split (its seed), its learning rate and a sample budget of the dense arm's iterations to the
default target at the demo's starting batch, over the total batches the demo's ranks can take.

The file is cached under :func:`cache_dir` keyed by a hash of that description (:func:`profile_key`), so
only the first run pays the probes; it is written atomically (a temp file in the same directory, then a
rename), and a file that does not load is recomputed with a warning. Its cost is reported separately from
the time to target, as the paper's offline profile is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from scheduler.profile.config import ProfileConfig
from scheduler.profile.probe_settings import ProbeSettings
from wanrt.errors import WanrtError

if TYPE_CHECKING:
    from collections.abc import Callable

    from scheduler.profile.surrogate import ConvergenceProfile
    from wanrt.demo.config import DemoConfig

__all__ = ["CachedProfile", "cache_dir", "demo_profile_config", "ensure_profile", "profile_key"]

#: bump when the probe's recipe changes meaning, so old cache files are not reused
RECIPE_VERSION: Final = 2
#: the probe's sample budget in iterations of the demo's starting total batch: its dense arm reaches the
#: default target (loss 0.1) in 145 iterations (docs/demo.md)
BUDGET_ITERATIONS: Final = 150
#: a probe stops at the target or at this many budgets (its count is then extrapolated)
CAP_BUDGETS: Final = 2
#: per-rank batch range the profile covers (the scheduler does not extrapolate ḡ beyond it)
MIN_RANK_BATCH: Final = 4
MAX_RANK_BATCH: Final = 256
#: the scheduler's default ``max_total_batch`` (scheduler/control/config.py)
MAX_TOTAL_BATCH: Final = 1024


def cache_dir() -> Path:
    """``$WANRT_CACHE_DIR``, else ``$XDG_CACHE_HOME/wanrt``, else ``~/.cache/wanrt``; profiles below it."""
    env = os.environ.get("WANRT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "wanrt"


def demo_profile_config(cfg: DemoConfig) -> ProfileConfig:
    """Algorithm 1's settings for the workload ``cfg`` trains: same MLP width, lr, data split, batch scale."""
    ranks = cfg.sites * cfg.ranks
    lo = max(8, ranks * MIN_RANK_BATCH)
    hi = max(lo + 1, min(MAX_TOTAL_BATCH, ranks * MAX_RANK_BATCH))
    probe = ProbeSettings(
        hidden=cfg.model_hidden,
        lr=cfg.lr,
        samples=CAP_BUDGETS * BUDGET_ITERATIONS * ranks * cfg.batch,
        seed=cfg.seed,
        measure="samples_to_target",
        target_loss=cfg.target_loss,
        eval_every=cfg.eval_every,
    )
    return ProfileConfig(min_total_batch=lo, max_total_batch=hi, seed=cfg.seed, probe=probe)


def profile_key(pcfg: ProfileConfig) -> str:
    """A short hash of everything that decides the profile's points (the workload and Algorithm 1's knobs)."""
    doc = {"recipe": RECIPE_VERSION, "dataset": "sklearn digits", "config": dataclasses.asdict(pcfg)}
    blob = json.dumps(doc, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class CachedProfile:
    """Where the profile is, and what it cost (0 s and ``cached`` when an earlier run computed it)."""

    path: Path
    cached: bool
    seconds: float
    probes: int
    key: str


def ensure_profile(
    cfg: DemoConfig,
    *,
    directory: Path | None = None,
    on_line: Callable[[str], None] = print,
    progress: bool = False,
    compute: Callable[[ProfileConfig], ConvergenceProfile] | None = None,
) -> CachedProfile:
    """The cached profile of ``cfg``'s workload, computing (and caching) it first if there is none.

    A cache file that does not load (truncated, edited, an older format) is recomputed with a warning line:
    it is a cache, the probes can always make it again. ``compute`` replaces Algorithm 1 (tests).
    """
    from scheduler.profile.surrogate import ConvergenceProfile

    pcfg = demo_profile_config(cfg)
    key = profile_key(pcfg)
    root = (directory if directory is not None else cache_dir()) / "profiles"
    path = root / f"demo-{key}.json"
    if path.exists():
        try:
            ConvergenceProfile.load(path)
            return CachedProfile(path, True, 0.0, 0, key)
        except (WanrtError, OSError, ValueError) as exc:
            on_line(f"warning: cached profile {path} is unusable ({exc}); recomputing it")
    total = pcfg.probes + 1 + int(pcfg.measure_staleness)
    on_line(
        f"profiling the convergence penalty of this workload (StellaTrain Alg. 1, {total} probes, "
        f"MLP h={pcfg.probe.hidden}, lr {pcfg.probe.lr:g}, total batch {pcfg.min_total_batch}–"
        f"{pcfg.max_total_batch}); cached in {path}"
    )
    t0 = time.monotonic()
    profile = compute(pcfg) if compute is not None else compute_profile(pcfg, progress=progress)
    seconds = time.monotonic() - t0
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=root)
    os.close(fd)
    try:
        profile.save(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        Path(tmp + ".tmp").unlink(missing_ok=True)
        raise
    on_line(f"profile done in {seconds:.1f} s ({total} probes)")
    return CachedProfile(path, False, seconds, total, key)


def compute_profile(pcfg: ProfileConfig, *, progress: bool = False) -> ConvergenceProfile:
    """Run Algorithm 1 with the demo-model probe (what ``wanrt profile`` runs)."""
    from scheduler.profile.bayesopt import run_profile
    from wanrt.demo.digits_probe import DigitsProbe

    probe = DigitsProbe(pcfg.probe)
    bar = None
    if progress:
        import sys

        from tqdm import tqdm

        bar = tqdm(
            total=pcfg.probes + 1 + int(pcfg.measure_staleness), desc="profile", unit="probe", file=sys.stderr
        )
    try:
        result = run_profile(
            probe.loss,
            pcfg,
            describe=probe.describe(),
            on_probe=(lambda _rec: bar.update(1)) if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    return result.profile
