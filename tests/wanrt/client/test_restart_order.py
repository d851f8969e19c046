"""The client's side of KILL_RESTART, on one rank with a scripted link: the order reaches its iteration,
then the hook runs or the context closes and RestartRequested leaves step(); and where a replacement
trainer process starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tests.wanrt.client.fake_link import ScriptedLink, scripted
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.site.decision import ConfigChange, SiteDecision, decode_body, decode_header, encode
from wanrt.errors import ConfigError, RemoteProtocolError, RestartRequested

pytestmark = pytest.mark.usefixtures("single_rank_group")

CFG = ClientConfig.dense_baseline(update_deadline_s=5.0)


def _make(
    secret_file: Path, config: ClientConfig, start: int = 0
) -> tuple[torch.nn.Linear, SparseOptimizer, ScriptedLink]:
    links: list[ScriptedLink] = []
    factory = scripted({}, links)

    def with_start(spec):  # type: ignore[no-untyped-def]
        link = factory(spec)
        link.start_iteration = start  # type: ignore[attr-defined]
        return link

    ctx = wanrt.client.init(
        "mem://gw", site="a", job="j", secret_file=secret_file, config=config, link_factory=with_start
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, SparseOptimizer(model.named_parameters(), "sgd", lr=0.1, ctx=ctx), links[0]


def _step(model: torch.nn.Linear, opt: SparseOptimizer) -> None:
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_without_a_hook_the_order_closes_the_context_and_raises_at_its_iteration(secret_file: Path) -> None:
    model, opt, link = _make(secret_file, CFG)
    link.announce(ConfigChange(effective_iteration=3, restart=0))
    _step(model, opt)
    _step(model, opt)  # iteration 1 → 2
    with pytest.raises(RestartRequested) as info:
        _step(model, opt)  # the end of iteration 2: iteration 3 begins with the restart
    exc = info.value
    assert exc.rank == 0 and exc.iteration == 3 and exc.site == "a"
    assert "torchrun" in str(exc) and "max-restarts" in str(exc)
    assert link.closed  # closed cleanly before raising: every push went, every result came
    assert isinstance(exc, wanrt.WanrtError)


def test_a_hook_runs_on_the_named_rank_and_training_goes_on(secret_file: Path) -> None:
    calls: list[tuple[int, int]] = []
    cfg = ClientConfig.dense_baseline(update_deadline_s=5.0, on_restart=lambda r, it: calls.append((r, it)))
    model, opt, link = _make(secret_file, cfg)
    link.announce(ConfigChange(effective_iteration=2, restart=0))
    for _ in range(4):
        _step(model, opt)
    assert calls == [(0, 2)]
    assert not link.closed


def test_an_order_for_another_rank_with_a_hook_leaves_this_rank_alone(secret_file: Path) -> None:
    calls: list[tuple[int, int]] = []
    cfg = ClientConfig.dense_baseline(update_deadline_s=5.0, on_restart=lambda r, it: calls.append((r, it)))
    model, opt, link = _make(secret_file, cfg)
    link.announce(ConfigChange(effective_iteration=1, restart=3))
    for _ in range(3):
        _step(model, opt)
    assert calls == []


def test_a_late_order_is_ignored(secret_file: Path) -> None:
    """A replayed order whose iteration passed (e.g. a replacement process that starts after it) must not
    restart anyone again."""
    model, opt, link = _make(secret_file, CFG)
    _step(model, opt)
    _step(model, opt)
    link.announce(ConfigChange(effective_iteration=1, restart=0))
    for _ in range(3):
        _step(model, opt)
    assert not link.closed


def test_a_replacement_process_starts_where_its_gateway_says(secret_file: Path) -> None:
    model, opt, link = _make(secret_file, CFG, start=40)
    _step(model, opt)
    assert [it for it, _, _ in link.pushed] == [40, 40]  # both layers, at the job's iteration


def test_telemetry_carries_the_ranks_batch_processing_time(secret_file: Path) -> None:
    model, opt, link = _make(secret_file, CFG)
    for _ in range(3):
        _step(model, opt)
    _, last = link.telemetry_seen[-1]
    assert "rank.0.compute_s" in last and last["rank.0.compute_s"] >= 0
    assert last["ranks.mean_compute_s"] == last["rank.0.compute_s"]


def test_the_site_broadcast_carries_the_order() -> None:
    d = SiteDecision(config_changes=[ConfigChange(7, density=0.5, restart=2), ConfigChange(9)])
    header, body, values = encode(d)
    n_body, n_val = decode_header(header, max_elements=1000)
    assert (n_body, n_val) == (body.shape[0], values.shape[0])
    back = decode_body(header, body, values)
    assert back.config_changes == d.config_changes
    assert np.array_equal(header, encode(back)[0])


def test_on_restart_must_be_callable() -> None:
    with pytest.raises(ConfigError) as info:
        ClientConfig(on_restart=3)  # type: ignore[arg-type]
    assert info.value.key == "on_restart"


def test_a_config_update_restart_must_name_a_rank() -> None:
    from wanrt.client.link.gateway_link import _config_change
    from wanrt.protocol import ConfigUpdate

    assert _config_change(ConfigUpdate({"restart": 2}, 5)).restart == 2
    for bad in (-1, 1.5, True, 1 << 20):
        with pytest.raises(RemoteProtocolError):
            _config_change(ConfigUpdate({"restart": bad}, 5))


def test_restart_count_reads_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert wanrt.restart_count() == 0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert wanrt.restart_count() == 2
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "x")
    with pytest.raises(ConfigError):
        wanrt.restart_count()
