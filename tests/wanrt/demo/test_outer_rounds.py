"""The demo's outer-loop arms run their gateways with re-coded results (issue 23 item 1): the
``[gateway.rounds]`` keys :meth:`DemoConfig.outer_rounds` gives, written into every site's file, loaded by
the daemon's own config loader; ``exact`` and a float pseudo-gradient keep the old exact sums."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gateways.config import load_gateway_config
from gateways.rounds.config import RoundConfig
from wanrt.demo.config import DEFAULT
from wanrt.demo.runner import Demo
from wanrt.demo.sites.config_files import write_run_files, write_secret
from wanrt.errors import ConfigError
from wanrt.job.files import write_job


def test_outer_rounds_recode_low_bit_pseudo_gradients_only() -> None:
    want = {"forward_policy": "cap", "forward_density": 3 * 0.03, "result_coding": "wire"}
    assert DEFAULT.outer_rounds() == want  # 3 sites × 3 % int2: the cap is the union's largest size
    assert dataclasses.replace(DEFAULT, outer_result_density=0.2).outer_rounds()["forward_density"] == 0.2
    assert dataclasses.replace(DEFAULT, outer_result_coding="exact").outer_rounds() == {}
    assert dataclasses.replace(DEFAULT, outer_wire="fp16").outer_rounds() == {}  # nothing low-bit to re-code
    RoundConfig(**DEFAULT.outer_rounds())  # type: ignore[arg-type]  # a config the engine accepts
    with pytest.raises(ConfigError, match="outer_result_coding"):
        dataclasses.replace(DEFAULT, outer_result_coding="int2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="outer_result_density"):
        dataclasses.replace(DEFAULT, outer_result_density=1.5)


def test_the_auto_arm_prices_re_coded_results_at_the_coding_bytes() -> None:
    assert Demo.mode_table(DEFAULT)["sum_value_bytes"] == 2 / 8 + 1 / 16
    assert "sum_value_bytes" not in Demo.mode_table(dataclasses.replace(DEFAULT, outer_result_coding="exact"))


def test_run_files_and_job_files_carry_the_rounds_keys(tmp_path: Path) -> None:
    rounds = DEFAULT.outer_rounds()
    files = write_run_files(
        dataclasses.replace(DEFAULT, fluctuating=False),
        job="j",
        run_dir=tmp_path / "run",
        sock_dir=tmp_path / "socks",
        secret_file=write_secret(tmp_path / "s"),
        trace_file=None,
        rounds=rounds,
    )
    for f in files:
        r = load_gateway_config(f.config).rounds
        assert (r.result_coding, r.forward_policy, r.forward_density) == ("wire", "cap", 0.09)
        assert r.round_deadline_s == DEFAULT.round_deadline_s  # the demo's own keys are kept
    job = write_job(tmp_path / "job", job="j1", sites=["a", "b"], base_port=7950, rounds=rounds)
    for path in job.gateways.values():
        assert load_gateway_config(path).rounds.result_coding == "wire"
    with pytest.raises(ConfigError):  # checked by the daemon's loader: re-coding without the cap
        write_job(
            tmp_path / "bad", job="j2", sites=["a", "b"], base_port=7960, rounds={"result_coding": "wire"}
        )
