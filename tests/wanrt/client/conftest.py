from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def single_rank_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A one-rank gloo default group in this process (one site with a single trainer)."""
    import torch.distributed as dist

    store = Path(tmp_path_factory.mktemp("dist")) / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    p = tmp_path / "job.key"
    p.write_bytes(b"0123456789abcdef-test-secret\n")
    return p
