"""wanrt.DiLoCo with the public client and torch, several sites in one process over an in-memory hub that
sums as the gateways do (tools/harness/summing_hub.py): bit-identical parameters at every site after
every outer step, the outer step is DiLoCo's (Algorithm 1 with torch's Nesterov SGD), error feedback loses
nothing of the pseudo-gradients, H switches at a round boundary, and the mistakes raise typed errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import wanrt
from tools.harness.summing_hub import Hub
from wanrt.client import ClientConfig
from wanrt.client.site.decision import ConfigChange
from wanrt.errors import ConfigError, LocalProtocolError

pytestmark = pytest.mark.usefixtures("single_rank_group")

IN, HIDDEN, OUT = 8, 16, 3


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batch(site: str, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * ord(site) + t)
    x = torch.randn(16, IN, generator=g)
    return x, torch.sin(x[:, :OUT]) + 0.1 * ord(site) % 3


def flat(ps: Any) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in ps])


Loop = Callable[[str, wanrt.DiLoCo, torch.nn.Module], None]


def run_sites(
    secret_file: Path,
    config: ClientConfig,
    loop: Loop,
    *,
    sites: tuple[str, ...] = ("a", "b"),
    make: Callable[[torch.nn.Module, wanrt.Context], wanrt.DiLoCo] | None = None,
    on_made: Callable[[dict[str, wanrt.DiLoCo]], None] | None = None,
) -> tuple[Hub, dict[str, wanrt.DiLoCo], dict[str, torch.nn.Module]]:
    hub = Hub(sites)
    opts: dict[str, wanrt.DiLoCo] = {}
    models: dict[str, torch.nn.Module] = {}
    for s in sites:
        ctx = wanrt.client.init(
            "mem://hub", site=s, job="j", secret_file=secret_file, config=config, link_factory=hub.link
        )
        m = models[s] = model()
        if make is not None:
            opts[s] = make(m, ctx)
        else:
            inner = torch.optim.AdamW(m.parameters(), lr=0.01)
            opts[s] = wanrt.DiLoCo(m, inner, ctx=ctx, sync_every=4)
    if on_made is not None:
        on_made(opts)
    errors: list[BaseException] = []

    def body(s: str) -> None:
        try:
            loop(s, opts[s], models[s])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(s,)) for s in sites]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120.0)
    assert not errors, errors
    return hub, opts, models


def train(n_steps: int, after_outer: Callable[[str, int, torch.nn.Module], None] | None = None) -> Loop:
    def loop(site: str, opt: wanrt.DiLoCo, m: torch.nn.Module) -> None:
        for t in range(n_steps):
            x, y = batch(site, t)
            torch.nn.functional.mse_loss(m(x), y).backward()
            before = opt.ctx.iteration
            opt.step()
            opt.zero_grad()
            if opt.ctx.iteration != before and after_outer is not None:
                after_outer(site, opt.ctx.iteration, m)
        opt.close()

    return loop


def snapshots() -> tuple[dict[tuple[str, int], torch.Tensor], Callable[[str, int, torch.nn.Module], None]]:
    seen: dict[tuple[str, int], torch.Tensor] = {}

    def record(site: str, it: int, m: torch.nn.Module) -> None:
        seen[(site, it)] = flat(m.parameters()).clone()

    return seen, record


@pytest.mark.parametrize(
    "config",
    [
        ClientConfig.dense_baseline(staleness=0),
        ClientConfig(density=0.1, staleness=0, wire_dtype="int8"),
        ClientConfig(density=0.05, staleness=1, wire_dtype="int2"),
    ],
    ids=["dense", "sparse-int8", "sparse-int2-stale1"],
)
def test_every_site_holds_identical_parameters_after_every_outer_step(
    secret_file: Path, config: ClientConfig
) -> None:
    seen, record = snapshots()
    anchors: dict[tuple[str, int], torch.Tensor] = {}
    opts: dict[str, wanrt.DiLoCo] = {}

    def keep(site: str, it: int, m: torch.nn.Module) -> None:
        record(site, it, m)
        anchors[(site, it)] = flat(opts[site].anchor).clone()

    hub, opts_, models = run_sites(secret_file, config, train(24, keep), on_made=opts.update)
    assert {opts_[s].ctx.iteration for s in "ab"} == {6}  # 24 inner steps, H = 4
    for it in range(1, 7):
        assert torch.equal(anchors[("a", it)], anchors[("b", it)]), it  # the job's parameters
        if config.staleness == 0:  # and the model's: nothing in flight, every local copy is the anchor
            assert torch.equal(seen[("a", it)], seen[("b", it)]), it
    assert not torch.equal(anchors[("a", 1)], anchors[("a", 6)])  # they trained
    assert torch.equal(flat(models["a"].parameters()), flat(models["b"].parameters()))
    # one push per layer per outer step, not per inner step
    assert sorted({it for (_, it, _) in hub.pushes}) == list(range(6))


@pytest.mark.parametrize("local_steps", [1, 3])
def test_the_outer_step_is_nesterov_sgd_on_the_averaged_pseudo_gradient(
    secret_file: Path, local_steps: int
) -> None:
    """Dense and synchronous: anchor_{t+1} = torch.optim.SGD(lr 0.7, momentum 0.9, nesterov) applied to the
    anchor with the mean of the sites' Δ = anchor − θ_i (DiLoCo Algorithm 1, §3). A ``local_steps`` setting
    (gradient accumulation of the per-step exchange) changes nothing: Δ is never divided by it."""
    deltas: dict[tuple[str, int], torch.Tensor] = {}
    seen, record = snapshots()

    def make(m: torch.nn.Module, ctx: wanrt.Context) -> wanrt.DiLoCo:
        inner = torch.optim.SGD(m.parameters(), lr=0.05)
        opt = wanrt.DiLoCo(m, inner, ctx=ctx, sync_every=3)

        def hook(*_: object) -> None:  # after the round's last inner step: Δ as the outer step will see it
            if opt.inner_steps_done + 1 == opt.round_length:
                deltas[(ctx.site, ctx.iteration)] = flat(opt.anchor) - flat(m.parameters())

        inner.register_step_post_hook(hook)
        return opt

    cfg = ClientConfig.dense_baseline(staleness=0, local_steps=local_steps)
    run_sites(secret_file, cfg, train(12, record), make=make)
    ref = torch.nn.Parameter(flat(model().parameters()).clone())
    outer = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    for t in range(4):
        ref.grad = (deltas[("a", t)] + deltas[("b", t)]) * 0.5
        outer.step()
        torch.testing.assert_close(seen[("a", t + 1)], ref.detach(), rtol=1e-5, atol=1e-6)


def test_error_feedback_loses_nothing_of_the_pseudo_gradients(secret_file: Path) -> None:
    """Outer SGD lr 1 without momentum, one site, 5 % density with int4 values: what the outer steps applied
    plus what the residual still holds is the sum of every round's pseudo-gradient."""
    deltas: list[torch.Tensor] = []
    state: dict[str, Any] = {}

    def make(m: torch.nn.Module, ctx: wanrt.Context) -> wanrt.DiLoCo:
        inner = torch.optim.AdamW(m.parameters(), lr=0.01)
        opt = wanrt.DiLoCo(m, inner, ctx=ctx, sync_every=2, outer_lr=1.0, outer_momentum=0.0)

        def hook(*_: object) -> None:
            if opt.inner_steps_done + 1 == opt.round_length:
                deltas.append(flat(opt.anchor) - flat(m.parameters()))

        inner.register_step_post_hook(hook)
        return opt

    def loop(site: str, opt: wanrt.DiLoCo, m: torch.nn.Module) -> None:
        for t in range(16):
            x, y = batch(site, t)
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
        state.update(opt.state_dict())  # staleness 0, at an outer step's end: nothing in flight
        opt.close()

    cfg = ClientConfig(density=0.05, staleness=0, wire_dtype="int4")
    _, _, models = run_sites(secret_file, cfg, loop, sites=("a",), make=make)
    residuals = state["outer"]["compression"]["error_feedback"]["residuals"]
    held = torch.cat(
        [
            torch.from_numpy(residuals.get(i, np.zeros(p.numel(), np.float32)))
            for i, p in enumerate(models["a"].parameters())
        ]
    )
    applied = flat(model().parameters()) - flat(models["a"].parameters())
    assert len(deltas) == 8
    assert float(held.abs().max()) > 0  # the residual did hold something back
    torch.testing.assert_close(applied + held, torch.stack(deltas).sum(0), rtol=1e-4, atol=1e-5)


def test_h_switches_at_a_round_boundary_at_every_site(secret_file: Path) -> None:
    """``sync_every()`` is read when a round begins: a change of the job's ``outer_steps`` (set on the
    context, as the scheduler's decision will be) takes effect for the next round at every site."""
    pushes_at: dict[str, list[int]] = {"a": [], "b": []}

    def loop(site: str, opt: wanrt.DiLoCo, m: torch.nn.Module) -> None:
        for t in range(20):
            x, y = batch(site, t)
            torch.nn.functional.mse_loss(m(x), y).backward()
            before = opt.ctx.iteration
            opt.step()
            opt.zero_grad()
            if opt.ctx.iteration != before:
                pushes_at[site].append(t)
                if opt.ctx.iteration == 2:  # both sites learn it at the same outer step
                    # the scheduler's decision as the site broadcast delivers it: in force from iteration 3
                    opt.ctx._settings.schedule([ConfigChange(3, outer_steps=1)])
                    assert opt.ctx.outer_steps is None and opt.round_length == 4  # the round keeps its H
        opt.close()

    _, opts, models = run_sites(secret_file, ClientConfig.dense_baseline(staleness=0), loop)
    # rounds of 4 until outer step 2 ... and 3 (it began with H 4), then every step
    assert pushes_at["a"] == pushes_at["b"] == [3, 7, 11, *range(12, 20)]
    assert opts["a"].sync_every() == 1
    assert torch.equal(flat(models["a"].parameters()), flat(models["b"].parameters()))


def test_telemetry_reports_the_time_of_one_inner_step(secret_file: Path) -> None:
    config = ClientConfig.dense_baseline(staleness=0, local_steps=2)
    hub, _, _ = run_sites(secret_file, config, train(16))
    _, metrics = hub.telemetry["a"][-1]
    assert metrics["inner_steps"] == 4.0 and metrics["local_steps"] == 1.0
    assert metrics["micro_step_s"] == pytest.approx(metrics["compute_s"] / 4)


def test_close_mid_round_drops_the_unfinished_inner_steps(secret_file: Path) -> None:
    seen, record = snapshots()
    _, opts, models = run_sites(secret_file, ClientConfig.dense_baseline(staleness=0), train(10, record))
    # 2 outer steps, then 2 inner steps dropped at close: the parameters are outer step 2's at both sites
    assert opts["a"].ctx.iteration == 2
    for s in "ab":
        assert torch.equal(flat(models[s].parameters()), seen[("a", 2)])


def test_mistakes_raise_typed_errors(secret_file: Path) -> None:
    hub = Hub(("a",))
    ctx = wanrt.client.init(
        "mem://hub",
        site="a",
        job="j",
        secret_file=secret_file,
        config=ClientConfig.dense_baseline(staleness=0),
        link_factory=hub.link,
    )
    m = model()
    with pytest.raises(ConfigError) as info:
        wanrt.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), ctx=ctx, sync_every=0)
    assert info.value.fields["key"] == "sync_every"
    with pytest.raises(ConfigError):
        wanrt.DiLoCo(m, "adamw", ctx=ctx)  # type: ignore[arg-type]
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError) as info:
        wanrt.DiLoCo(m, torch.optim.SGD(other.parameters(), lr=0.1), ctx=ctx)
    assert info.value.fields["key"] == "inner_optimizer"
    with pytest.raises(ConfigError):
        wanrt.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), ctx=ctx, outer_momentum=1.5)
    opt = wanrt.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), ctx=ctx, sync_every=3)
    m(torch.ones(2, IN)).sum().backward()
    opt.step()
    with pytest.raises(LocalProtocolError):
        opt.state_dict()  # mid-round
    opt.close()
    ctx2 = wanrt.client.init(
        "mem://hub2",
        site="a",
        job="j",
        secret_file=secret_file,
        config=ClientConfig.dense_baseline(staleness=0),
        link_factory=Hub(("a",)).link,
    )
    sgd = wanrt.SparseOptimizer(model(), "sgd", lr=0.1, ctx=ctx2)
    with pytest.raises(LocalProtocolError):
        ctx2.outer_exchange.local_step()  # only under an outer loop
    ctx2.close()
    del sgd


def test_checkpoint_round_trip_resumes_identically(secret_file: Path) -> None:
    """state_dict() after close() at an outer step's end, loaded into a fresh run resumed at its iteration:
    the continued run matches an uninterrupted one bit for bit (one site, staleness 0)."""

    def make_adamw(m: torch.nn.Module, ctx: wanrt.Context) -> wanrt.DiLoCo:
        return wanrt.DiLoCo(m, torch.optim.AdamW(m.parameters(), lr=0.01), ctx=ctx, sync_every=3)

    def loop_range(lo: int, hi: int, out: dict[str, Any]) -> Loop:
        def loop(site: str, opt: wanrt.DiLoCo, m: torch.nn.Module) -> None:
            for t in range(lo, hi):
                x, y = batch(site, t)
                torch.nn.functional.mse_loss(m(x), y).backward()
                opt.step()
                opt.zero_grad()
            opt.close()
            out["state"] = opt.state_dict()
            out["params"] = flat(m.parameters()).clone()

        return loop

    cfg = ClientConfig(density=0.2, staleness=0)
    full: dict[str, Any] = {}
    run_sites(secret_file, cfg, loop_range(0, 12, full), sites=("a",), make=make_adamw)
    first: dict[str, Any] = {}
    run_sites(secret_file, cfg, loop_range(0, 6, first), sites=("a",), make=make_adamw)
    hub = Hub(("a",))
    ctx = wanrt.client.init(
        "mem://hub",
        site="a",
        job="j",
        secret_file=secret_file,
        config=cfg,
        link_factory=hub.link,
        resume_at=first["state"]["outer"]["iteration"],
    )
    m = model()
    opt = make_adamw(m, ctx)
    opt.load_state_dict(first["state"])
    assert torch.equal(flat(m.parameters()), first["params"])
    rest: dict[str, Any] = {}
    loop_range(6, 12, rest)("a", opt, m)
    assert torch.equal(rest["params"], full["params"])
