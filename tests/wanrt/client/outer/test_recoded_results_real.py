"""Re-coded results on real gateways (issue 23 item 1): three sites' DiLoCo trainers (tools/outer_trainer.py,
the public client with ``wanrt.DiLoCo``, 2-bit pseudo-gradients) against ``wanrt gateway`` processes whose
tree root re-codes every round's sum in 2 bits (``[gateway.rounds] result_coding = "wire"``, capped by
``forward_policy = "cap"``) instead of sending it back in fp32. Site b's trainer is SIGKILLed once and
launched again. The parameters (the anchors' digest) are bit-identical at every site after every outer step,
as with exact results, and the gateways send far fewer bytes."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tools.real_job import RealJob

pytestmark = pytest.mark.slow

STEPS = 24
SITES = ("a", "b", "c")
ARGS = [
    "--outer-steps", str(STEPS), "--sync-every", "4", "--compute-s", "0.01", "--deadline-s", "30",
    "--density", "0.3", "--wire-dtype", "int2", "--staleness", "1",
]  # fmt: skip
RECODED = {"forward_policy": "cap", "forward_density": 0.9, "result_coding": "wire"}


def _wan_bytes(job: RealJob) -> int:
    total = 0
    for site in SITES:
        with urllib.request.urlopen(job.files.status_urls[site], timeout=10) as r:
            total += int(json.load(r)["counters"]["bytes_sent"])
    return total


def _run(root: Path, rounds: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], int]:
    with RealJob(root, sites=SITES, trainer_module="tools.outer_trainer", rounds=rounds) as job:
        job.start_gateways()
        for site in SITES:
            job.start_trainer(site, *ARGS)
        assert job.wait_iteration("b", 6, 90), job.trainer_log("b")[-3000:]
        job.kill_trainer("b")
        job.start_trainer("b", *ARGS)
        codes = job.wait_trainers(150)
        assert codes == dict.fromkeys(SITES, 0), {s: job.trainer_log(s)[-2000:] for s in SITES}
        sent = _wan_bytes(job)
        recs = {s: job.records(s) for s in SITES}
    return recs, sent


def _check_identical(recs: dict[str, list[dict[str, Any]]]) -> None:
    a_at = {r["it"]: r["digest"] for r in recs["a"]}
    assert sorted(a_at) == list(range(1, STEPS + 1))
    c_at = {r["it"]: r["digest"] for r in recs["c"]}
    assert c_at == a_at  # the other untouched site: equal at every outer step
    pids = list(dict.fromkeys(r["pid"] for r in recs["b"]))
    assert len(pids) == 2
    first = [r for r in recs["b"] if r["pid"] == pids[0]]
    joined = [r for r in recs["b"] if r["pid"] == pids[1] and r["resyncs"] == 1]
    assert len(first) >= 6 and joined and joined[-1]["it"] == STEPS
    assert [r["it"] for r in first + joined if r["digest"] != a_at[r["it"]]] == []


def test_recoded_results_keep_every_site_identical_and_cut_the_wan_bytes(tmp_path: Path) -> None:
    exact, exact_bytes = _run(tmp_path / "exact", {})
    recoded, recoded_bytes = _run(tmp_path / "wire", RECODED)
    _check_identical(exact)
    _check_identical(recoded)
    # the union of three 30 % supports comes back in 2 bits instead of 32: far fewer bytes on the WAN
    assert recoded_bytes < 0.5 * exact_bytes, (recoded_bytes, exact_bytes)
