"""The data every rank trains on, and the model every rank starts from."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wanrt.demo.workload.data import CLASSES, FEATURES, Sampler, load_split
from wanrt.demo.workload.model import build_mlp, evaluate, n_parameters, parameter_digest


def test_split_is_stratified_held_out_and_scaled() -> None:
    d = load_split(seed=0)
    assert d.x_train.shape[1] == FEATURES and len(d.x_train) + len(d.x_test) == 1797
    assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int64
    assert float(d.x_train.min()) >= 0.0 and float(d.x_train.max()) <= 1.0
    assert set(d.y_test.tolist()) == set(range(CLASSES))
    train_rows = {tuple(r) for r in d.x_train.tolist()}
    assert sum(tuple(r) in train_rows for r in d.x_test.tolist()) < 20  # (a few digits are exact duplicates)
    assert np.array_equal(load_split(seed=0).y_test, d.y_test)


def test_shards_partition_the_training_split_and_batches_are_reproducible() -> None:
    d = load_split(seed=0)
    world = 6
    samplers = [Sampler(d, index=i, world=world, batch=8, seed=1) for i in range(world)]
    assert sum(s.shard_size for s in samplers) == len(d.y_train)
    x1, y1 = Sampler(d, index=2, world=world, batch=8, seed=1).next()
    x2, y2 = Sampler(d, index=2, world=world, batch=8, seed=1).next()
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x3, _ = Sampler(d, index=3, world=world, batch=8, seed=1).next()
    assert not torch.equal(x1, x3)
    with pytest.raises(ValueError):
        Sampler(d, index=6, world=world, batch=8, seed=1)


def test_a_batch_change_keeps_batches_a_function_of_the_iteration() -> None:
    """The scheduler may resize a site's batch at any iteration; the draw of later iterations must not
    depend on when that happened, and a grown batch starts with the samples of the smaller one."""
    d = load_split(seed=0)
    steady = Sampler(d, index=1, world=3, batch=8, seed=2)
    changed = Sampler(d, index=1, world=3, batch=8, seed=2)
    for _ in range(3):
        steady.next()
        changed.next()
    changed.set_batch(24)
    xb, yb = changed.next()
    xs, ys = steady.next()
    assert xb.shape == (24, FEATURES) and torch.equal(xb[:8], xs) and torch.equal(yb[:8], ys)
    assert np.array_equal(changed.indices(9)[:8], steady.indices(9))
    changed.set_batch(8)
    assert torch.equal(changed.at(7)[0], steady.at(7)[0])
    with pytest.raises(ValueError):
        changed.set_batch(0)


def test_same_seed_same_model_and_the_size_formula() -> None:
    a, b = build_mlp(512, seed=0), build_mlp(512, seed=0)
    assert parameter_digest(a) == parameter_digest(b)
    assert parameter_digest(a) != parameter_digest(build_mlp(512, seed=1))
    h = 512
    assert n_parameters(a) == 64 * h + h + h * h + h + h * 10 + 10
    _, _, x_test, y_test = load_split(seed=0).tensors()
    loss, acc = evaluate(a, x_test, y_test)
    assert loss == pytest.approx(2.3, abs=0.2) and acc < 0.3  # untrained: about chance
