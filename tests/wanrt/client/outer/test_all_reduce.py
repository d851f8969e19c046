"""ctx.all_reduce / all_reduce_async with the public client and torch, two sites in one process over the
in-memory hub that sums as the gateways do: the average is identical at every site (exact when dense),
the async form overlaps, error feedback loses nothing over a run, the registered tensors are the job's
signature the gateways check, and every mistake has its typed error."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import wanrt
from tools.harness.summing_hub import Hub
from wanrt.client import ClientConfig
from wanrt.client.errors import TensorMismatch, UnknownTensor, UnsupportedTensorDtype
from wanrt.errors import ConfigError, LocalProtocolError

pytestmark = pytest.mark.usefixtures("single_rank_group")

SHAPES = {"w": (6, 16), "b": (40,)}


def local(site: str, name: str, call: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * ord(site) + 10 * call + len(name))
    return torch.randn(SHAPES[name], generator=g)


def run(
    secret_file: Path, config: ClientConfig, body: Callable[[str, wanrt.Context], Any]
) -> tuple[Hub, dict[str, Any]]:
    hub = Hub(("a", "b"))
    ctxs = {
        s: wanrt.client.init(
            "mem://hub", site=s, job="j", secret_file=secret_file, config=config, link_factory=hub.link
        )
        for s in hub.sites
    }
    for ctx in ctxs.values():
        ctx.register_tensors({n: torch.zeros(shape) for n, shape in SHAPES.items()})
    out: dict[str, Any] = {}
    errors: list[BaseException] = []

    def go(s: str) -> None:
        try:
            out[s] = body(s, ctxs[s])
            ctxs[s].close()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(s,)) for s in hub.sites]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60.0)
    assert not errors, errors
    return hub, out


def test_the_average_is_exact_and_identical_at_every_site(secret_file: Path) -> None:
    def body(site: str, ctx: wanrt.Context) -> list[torch.Tensor]:
        got = [ctx.all_reduce("w", local(site, "w", 0)), ctx.all_reduce("b", local(site, "b", 1))]
        handle = ctx.all_reduce_async("w", local(site, "w", 2).double())
        busy = local(site, "b", 3).sum()  # work between the push and the wait
        got.append(handle.wait())
        assert handle.done and torch.isfinite(busy)
        assert ctx.iteration == 3  # one WAN iteration per all-reduce
        return got

    hub, out = run(secret_file, ClientConfig.dense_baseline(staleness=1), body)  # synchronous anyway
    for k, (name, call) in enumerate([("w", 0), ("b", 1), ("w", 2)]):
        want = (local("a", name, call) + local("b", name, call)) * 0.5
        assert torch.equal(out["a"][k], out["b"][k])
        torch.testing.assert_close(out["a"][k].float(), want, rtol=0, atol=1e-6)
    assert out["a"][2].dtype == torch.float64  # the input's dtype back
    # the registered tensors are the signature the gateways compare across sites (a different shape at
    # one site is a ModelMismatch there, as for a model)
    sig = hub.links["a"].spec.signature
    assert sig.names == ("tensor:w", "tensor:b") and sig.shapes == ((6, 16), (40,))


def test_compressed_averages_lose_nothing_over_a_run(secret_file: Path) -> None:
    """5 % density with int4 values and error feedback: what the calls of a name returned, minus what the
    residuals still hold back (the pushes are the negated tensors), is the exact sum of the averages."""
    calls = 6
    residuals: dict[str, Any] = {}

    def body(site: str, ctx: wanrt.Context) -> torch.Tensor:
        total = torch.zeros(SHAPES["w"])
        for c in range(calls):
            ctx.all_reduce("b", local(site, "b", c))  # also carries w's leftovers: kept for w's next call
            total += ctx.all_reduce("w", local(site, "w", c))
        state = ctx.optimizer_state()
        residuals[site] = state["compression"]["error_feedback"]["residuals"].get(0)
        return total

    _, out = run(secret_file, ClientConfig(density=0.05, wire_dtype="int4"), body)
    assert torch.equal(out["a"], out["b"])
    want = sum((local("a", "w", c) + local("b", "w", c)) * 0.5 for c in range(calls))
    held = (torch.from_numpy(residuals["a"]) + torch.from_numpy(residuals["b"])).reshape(SHAPES["w"]) * 0.5
    assert float(held.abs().max()) > 0  # compression did hold something back
    torch.testing.assert_close(out["a"] - held, want, rtol=1e-4, atol=1e-5)


def test_mistakes_have_typed_errors(secret_file: Path) -> None:
    hub = Hub(("a",))
    ctx = wanrt.client.init(
        "mem://hub", site="a", job="j", secret_file=secret_file,
        config=ClientConfig.dense_baseline(), link_factory=hub.link,
    )  # fmt: skip
    with pytest.raises(UnknownTensor):
        ctx.all_reduce("w", torch.zeros(3))  # nothing registered yet
    with pytest.raises(UnsupportedTensorDtype):
        ctx.register_tensors({"n": torch.zeros(3, dtype=torch.int64)})
    ctx.register_tensors({"w": (3,)})
    with pytest.raises(LocalProtocolError):
        ctx.register_tensors({"v": (3,)})
    with pytest.raises(UnknownTensor) as unknown:
        ctx.all_reduce("v", torch.zeros(3))
    assert "register_tensors" in str(unknown.value)
    with pytest.raises(TensorMismatch):
        ctx.all_reduce("w", torch.zeros(4))
    with pytest.raises(UnsupportedTensorDtype):
        ctx.all_reduce("w", torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ConfigError):
        ctx.all_reduce("w", torch.zeros(3), op="max")
    handle = ctx.all_reduce_async("w", torch.ones(3))
    with pytest.raises(LocalProtocolError):
        ctx.all_reduce_async("w", torch.ones(3))  # one in flight at a time
    assert torch.equal(handle.wait(), torch.ones(3))
    assert torch.equal(handle.wait(), torch.ones(3))  # collected once, kept
    ctx.close()
