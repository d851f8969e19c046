"""``wanrt demo``: the whole system on one machine, training a real model with a dense baseline beside it.

S sites × R trainer processes (one gloo process group per site) and one real gateway daemon per site, joined
by shaped unix-socket links (rate, RTT, jitter, one site on a fluctuating bandwidth trace), train an MLP on
scikit-learn's digits three times: with the client's dense baseline (what DDP would send: every element in
fp32, synchronous), with wanrt at fixed settings (compressed sparse exchange, error feedback, partial
staleness) and with wanrt under the job's scheduler (``wanrt scheduler``: density, per-site batch sizes and
staleness decided from telemetry). The parent prints progress bars, a side-by-side summary and ratios,
writes a plot (loss against time; the link, the scheduler's estimate and its choices) and JSON.

Public names (what ``wanrt demo`` and the benchmarks in ``tools/`` use)::

    with Demo(QUICK, out_dir) as demo:            # wanrt.demo.runner: spawn, run, stop every child
        runs = [demo.run(mode) for mode in ARMS]  # "dense", "wanrt", "adaptive"
    print(format_table(compare(*runs)))           # wanrt.demo.results

* :class:`Demo`, :data:`MODES`, :data:`ARMS`, ``Mode`` (:mod:`~wanrt.demo.runner`): one comparison, the
  fixed-setting modes, the demo's three arms.
* :class:`DemoConfig`, :data:`DEFAULT`, :data:`QUICK` (:mod:`~wanrt.demo.config`): flags → frozen config.
* :class:`RunResult`, :class:`Comparison`, :func:`compare`, :func:`format_table`, :func:`write_json`
  (:mod:`~wanrt.demo.results`) and :func:`plot_loss_vs_time` (:mod:`~wanrt.demo.plot`): what is reported.
* :class:`DemoFailed` (:mod:`~wanrt.demo.failures`): a child failed; names it and shows its log.
* :mod:`~wanrt.demo.cli`: the ``wanrt demo`` subcommand.

Internals: :mod:`wanrt.demo.workload` (the data and the model that are trained), :mod:`wanrt.demo.sites`
(each site's gateway config files and gateway processes), :mod:`wanrt.demo.trainers` (the trainer
processes: spawning them, their body and training loop, the parent↔trainer messages, the common stop).
``--ddp`` (root): :mod:`wanrt.demo.netns_sites` (every site a network namespace behind tbf-shaped links),
:mod:`wanrt.demo.ddp_arm` and :mod:`wanrt.demo.ddp_worker` (the real PyTorch DDP baseline across them),
:mod:`wanrt.demo.ddp_results` and :mod:`wanrt.demo.ddp_option` (its table and its flag).

Names resolve lazily: importing this package imports neither torch nor the gateway.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wanrt.demo.config import DEFAULT, QUICK, DemoConfig
    from wanrt.demo.failures import DemoFailed
    from wanrt.demo.plot import plot_loss_vs_time
    from wanrt.demo.results import Comparison, RunResult, compare, format_table, write_json
    from wanrt.demo.runner import ARMS, MODES, Demo, Mode

#: public name -> module that defines it
EXPORTS: dict[str, str] = {
    "DEFAULT": "wanrt.demo.config",
    "QUICK": "wanrt.demo.config",
    "DemoConfig": "wanrt.demo.config",
    "DemoFailed": "wanrt.demo.failures",
    "plot_loss_vs_time": "wanrt.demo.plot",
    "Comparison": "wanrt.demo.results",
    "RunResult": "wanrt.demo.results",
    "compare": "wanrt.demo.results",
    "format_table": "wanrt.demo.results",
    "write_json": "wanrt.demo.results",
    "ARMS": "wanrt.demo.runner",
    "MODES": "wanrt.demo.runner",
    "Demo": "wanrt.demo.runner",
    "Mode": "wanrt.demo.runner",
}

__all__ = [
    "ARMS",
    "DEFAULT",
    "MODES",
    "QUICK",
    "Comparison",
    "Demo",
    "DemoConfig",
    "DemoFailed",
    "Mode",
    "RunResult",
    "compare",
    "format_table",
    "plot_loss_vs_time",
    "write_json",
]


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wanrt.demo' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(EXPORTS))
