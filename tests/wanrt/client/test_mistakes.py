"""Each mistake a user can make gives one clear WanrtError, through the public API and the real link."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import wanrt
from tools.harness.fake_gateway import FakeGateway, run_in_thread
from wanrt.client import DistributedNotInitialized, GatewayUnreachable, ModelMismatch, SparseOptimizer
from wanrt.client.link.signature import LayerSignature
from wanrt.client.site.process_group import REQUIRED_ENV

SECRET = b"0123456789abcdef-test-secret"


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[FakeGateway]:
    gw = FakeGateway(f"unix://{tmp_path}/gw.sock", sites=("a", "b"), job="j", secret=SECRET)
    with run_in_thread(gw):
        yield gw


def test_no_process_group_and_no_torchrun_env(monkeypatch: pytest.MonkeyPatch, secret_file: Path) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # whatever other test modules left behind
    for key in REQUIRED_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(DistributedNotInitialized) as info:
        wanrt.init("unix:///x.sock", site="a", job="j", secret_file=secret_file)
    text = str(info.value)
    assert "MASTER_ADDR" in text and "torchrun" in text and "init_process_group" in text


@pytest.mark.usefixtures("single_rank_group")
class TestWithOneRank:
    def test_gateway_unreachable_names_the_url(self, tmp_path: Path, secret_file: Path) -> None:
        url = f"unix://{tmp_path}/no-gateway-here.sock"
        with pytest.raises(GatewayUnreachable) as info:  # at init: before a model is built
            wanrt.init(url, site="a", job="j", secret_file=secret_file)
        assert url in str(info.value) and "wanrt gateway" in str(info.value)

    def test_wrong_secret(self, gateway: FakeGateway, tmp_path: Path) -> None:
        wrong = tmp_path / "wrong.key"
        wrong.write_text("not-the-job-secret-at-all\n")
        with pytest.raises(wanrt.AuthError, match="does not share this job's secret"):
            wanrt.init(gateway.url, site="a", job="j", secret_file=wrong)

    def test_model_differing_from_another_sites(self, gateway: FakeGateway, secret_file: Path) -> None:
        m = model()
        names = [n for n, _ in m.named_parameters()]
        shapes = [tuple(p.shape) for _, p in m.named_parameters()]
        shapes[2] = (9, 8)  # site b built a wider second layer
        gateway.model_info = LayerSignature.of(names, shapes, ["float32"] * len(names)).info()
        gateway.model_site = "b"
        ctx = wanrt.init(gateway.url, site="a", job="j", secret_file=secret_file)
        with pytest.raises(ModelMismatch) as info:
            SparseOptimizer(m.named_parameters(), "sgd", lr=0.1, ctx=ctx)
        assert "layer 2 '2.weight' shape (2, 8)" in str(info.value) and "trained by site b" in str(info.value)

    def test_missing_secret_file(self, tmp_path: Path) -> None:
        with pytest.raises(wanrt.ConfigError, match="cannot read the job secret file"):
            wanrt.init("unix:///x.sock", site="a", job="j", secret_file=tmp_path / "absent.key")

    def test_params_that_are_not_tensors(self, gateway: FakeGateway, secret_file: Path) -> None:
        ctx = wanrt.init(gateway.url, site="a", job="j", secret_file=secret_file)
        with pytest.raises(wanrt.ConfigError, match="not a tensor"):
            SparseOptimizer([1.0], "sgd", lr=0.1, ctx=ctx)  # type: ignore[list-item]
