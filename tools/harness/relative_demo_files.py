"""The demo's run files written with relative paths, as `wanrt demo --out demo-out` writes them (issue 21:
a relative path inside a TOML was read relative to the TOML's own folder). Shared by the config-file test
and ``tools/chaos_probes.py``'s relative-path probe, which both load the files from another directory."""

from __future__ import annotations

from pathlib import Path

from wanrt.demo.config import DemoConfig
from wanrt.demo.sites.config_files import SiteFiles, fluctuating_trace, write_run_files, write_secret

__all__ = ["write_relative_demo_run"]


def write_relative_demo_run(sites: int = 2) -> list[SiteFiles]:
    """Into ``demo-out/dense`` under the current directory: the trace, the secret and every site's TOML,
    each given to the writer as a relative path."""
    cfg = DemoConfig(sites=sites)
    run = Path("demo-out") / "dense"
    run.mkdir(parents=True)
    fluctuating_trace(cfg).save(run / "fluctuating-site.csv")
    return write_run_files(
        cfg,
        job="j",
        run_dir=run,
        sock_dir=Path("socks"),
        secret_file=write_secret(run / "job.secret"),
        trace_file=run / "fluctuating-site.csv",
    )
