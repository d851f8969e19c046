"""Streaming DiLoCo (arXiv 2501.18512) with wanrt.DiLoCo(fragments=P): fragments synchronised in turn, one
per exchange, the others pushing nothing; every site's anchors (the job's parameters) bit-identical after
every outer step while the local copies mix the late updates in (§2.3); and, on one site with the outer
step set to a plain average, the bookkeeping neither loses nor double-counts local progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import wanrt
from tests.wanrt.client.outer.test_diloco import batch, flat, model, run_sites
from wanrt.client import ClientConfig
from wanrt.client.outer.fragments import Landings, fragment_layers

pytestmark = pytest.mark.usefixtures("single_rank_group")


def streaming(h: int, p: int, mixing: float, **outer: Any) -> Any:
    def make(m: torch.nn.Module, ctx: wanrt.Context) -> wanrt.DiLoCo:
        inner = torch.optim.AdamW(m.parameters(), lr=0.01)
        return wanrt.DiLoCo(m, inner, ctx=ctx, sync_every=h, fragments=p, mixing=mixing, **outer)

    return make


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_anchors_are_identical_at_every_site_and_one_fragment_travels_per_exchange(
    secret_file: Path, staleness: int
) -> None:
    anchors: dict[tuple[str, int], torch.Tensor] = {}
    models: dict[tuple[str, int], torch.Tensor] = {}

    def loop(site: str, opt: wanrt.DiLoCo, m: torch.nn.Module) -> None:
        assert opt.round_length == 2 and opt.fragments == 2  # H 4, P 2: an exchange every 2 inner steps
        for t in range(24):
            x, y = batch(site, t)
            torch.nn.functional.mse_loss(m(x), y).backward()
            before = opt.ctx.iteration
            opt.step()
            opt.zero_grad()
            if opt.ctx.iteration != before:
                anchors[(site, opt.ctx.iteration)] = flat(opt.anchor).clone()
                models[(site, opt.ctx.iteration)] = flat(m.parameters()).clone()
        opt.close()

    cfg = ClientConfig(density=0.25, staleness=staleness, wire_dtype="int8")
    hub, _, final = run_sites(secret_file, cfg, loop, make=streaming(4, 2, 0.5))
    for it in range(1, 13):
        assert torch.equal(anchors[("a", it)], anchors[("b", it)]), it
    assert any(not torch.equal(models[("a", it)], models[("b", it)]) for it in range(1, 13))  # mixed, local
    assert torch.equal(flat(final["a"].parameters()), flat(final["b"].parameters()))  # close: the anchors
    n_layers = len(list(final["a"].parameters()))
    for (site, it, layer), payload in hub.pushes.items():
        synced = layer in fragment_layers(it, n_layers, 2)
        assert (payload.nnz_blocks > 0) == synced, (site, it, layer)


@pytest.mark.parametrize(("fragments", "staleness"), [(1, 0), (2, 0), (2, 2), (1, 1), (2, 3)])
def test_one_site_with_a_plain_average_follows_local_training_exactly(
    secret_file: Path, fragments: int, staleness: int
) -> None:
    """One site, outer SGD lr 1 without momentum, dense: an outer step hands the site its own progress
    back, so the local copy must follow plain local training — unless the bookkeeping lost progress or
    counted it twice. Synchronous (s = 0, any α), and landing after the fragment's next exchange (s ≥ P:
    the progress in flight is kept locally and swapped for the job's update when it lands). (With
    0 < s < P the paper's mixing drops part of the τ steps' progress by design, §2.3.)"""
    steps = 20

    def loop(site: str, opt: wanrt.DiLoCo, m: torch.nn.Module) -> None:
        for t in range(steps):
            x, y = batch(site, t)
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()

    def make(m: torch.nn.Module, ctx: wanrt.Context) -> wanrt.DiLoCo:
        inner = torch.optim.SGD(m.parameters(), lr=0.05)
        return wanrt.DiLoCo(m, inner, ctx=ctx, sync_every=4, fragments=fragments, mixing=0.5,
                            outer_lr=1.0, outer_momentum=0.0)  # fmt: skip

    cfg = ClientConfig.dense_baseline(staleness=staleness)
    _, opts, models = run_sites(secret_file, cfg, loop, sites=("a",), make=make)
    local = flat(models["a"].parameters()).clone()  # before close(): the local copy, updates in flight
    opts["a"].close()
    ref = model()
    sgd = torch.optim.SGD(ref.parameters(), lr=0.05)
    for t in range(steps):
        x, y = batch("a", t)
        torch.nn.functional.mse_loss(ref(x), y).backward()
        sgd.step()
        sgd.zero_grad()
    torch.testing.assert_close(local, flat(ref.parameters()), rtol=1e-5, atol=1e-6)


def test_the_late_update_is_mixed_into_the_landed_fragment_only(secret_file: Path) -> None:
    """Staleness 0, P 2, α 0.3: after an outer step the synchronised fragment's local copy is
    α·θ + (1 − α)·anchor; the other fragment's is left as the inner steps made it."""
    checks: list[int] = []
    pre: dict[str, list[torch.Tensor]] = {}

    def make(m: torch.nn.Module, ctx: wanrt.Context) -> wanrt.DiLoCo:
        inner = torch.optim.SGD(m.parameters(), lr=0.05)
        opt = wanrt.DiLoCo(m, inner, ctx=ctx, sync_every=4, fragments=2, mixing=0.3)

        def hook(*_: object) -> None:  # after the round's last inner step: θ as the outer step sees it
            if opt.inner_steps_done + 1 == opt.round_length:
                pre[ctx.site] = [p.detach().clone() for p in m.parameters()]

        inner.register_step_post_hook(hook)
        return opt

    def loop(site: str, opt: wanrt.DiLoCo, m: torch.nn.Module) -> None:
        params = list(m.parameters())
        for t in range(16):
            x, y = batch(site, t)
            torch.nn.functional.mse_loss(m(x), y).backward()
            it = opt.ctx.iteration
            opt.step()
            opt.zero_grad()
            if opt.ctx.iteration == it:
                continue
            synced = fragment_layers(it, len(params), 2)
            for i, p in enumerate(params):
                before = pre[site][i]
                want = before * 0.3 + opt.anchor[i] * 0.7 if i in synced else before
                torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
            if site == "a":
                checks.append(it)
        opt.close()

    run_sites(secret_file, ClientConfig.dense_baseline(staleness=0), loop, make=make)
    assert checks == list(range(8))


def test_fragments_are_strided_and_landings_follow_the_bound() -> None:
    assert fragment_layers(0, 5, 2) == {0, 2, 4} and fragment_layers(3, 5, 2) == {1, 3}
    assert fragment_layers(7, 3, 1) == {0, 1, 2}
    led = Landings()
    g = torch.ones(2)
    led.pushed(0, frozenset({0, 2}), None)
    led.pushed(1, frozenset({1}), {1: g})
    assert led.in_flight(1) == [g] and led.in_flight(0) == []
    assert led.landed(-1) == {}
    assert led.landed(0) == {0: None, 2: None}
    assert led.landed(5) == {1: [g]}
    assert led.in_flight(1) == []
