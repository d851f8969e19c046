"""The demo's data: scikit-learn's handwritten digits, shipped inside the installed package (no download).

1797 8×8 images, 10 classes. A stratified 80/20 split (fixed by the seed) gives the training split every
rank samples from and a held-out split for accuracy. The parent loads it once (:func:`load_split`, the only
place that imports scikit-learn, which costs seconds) and ships the arrays to the trainers. The training
split is dealt round-robin into one shard per rank of the whole job (sites × ranks), so each trainer sees
its own data, like data-parallel training over a sharded dataset; the minibatch of each iteration is drawn
from the shard by a generator seeded with (seed, shard, iteration), so every run sees exactly the same
batches in the same order, whatever batch sizes the scheduler gives it.
torch is imported on use only: the trainer processes import this module before they pin their threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

__all__ = ["CLASSES", "FEATURES", "DigitsSplit", "Sampler", "load_split"]

FEATURES: Final = 64
CLASSES: Final = 10
#: the held-out fraction; 360 images are plenty to tell 90 % from 97 % accuracy
TEST_FRACTION: Final = 0.2


@dataclass(frozen=True)
class DigitsSplit:
    """Features scaled to [0, 1] (float32), labels int64; plain arrays, cheap to pickle to a trainer."""

    x_train: npt.NDArray[np.float32]
    y_train: npt.NDArray[np.int64]
    x_test: npt.NDArray[np.float32]
    y_test: npt.NDArray[np.int64]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_train, y_train, x_test, y_test) as tensors sharing the arrays' memory."""
        import torch

        return (
            torch.from_numpy(self.x_train),
            torch.from_numpy(self.y_train),
            torch.from_numpy(self.x_test),
            torch.from_numpy(self.y_test),
        )


def load_split(seed: int) -> DigitsSplit:
    """The stratified split; pixel values 0..16 scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (np.asarray(x, dtype=np.float32) / np.float32(16.0)).astype(np.float32)
    y = np.asarray(y, dtype=np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=TEST_FRACTION, random_state=seed, stratify=y)
    return DigitsSplit(xtr, ytr, xte, yte)


class Sampler:
    """Minibatches from one rank's shard: the ``index``-th of ``world`` round-robin training slices.

    The batch of iteration ``i`` depends only on (seed, shard, ``i``, batch size), not on what was drawn
    before: the scheduler may change a site's batch size at any iteration, and every rank of every run must
    still draw reproducible batches, so the runs' curves differ only by what the exchange (and the batch
    sizes the scheduler chose) did. A larger batch extends the smaller one (the first ``b`` indices of a
    ``b' > b`` draw are the ``b`` draw), so a batch change adds samples rather than replacing them.
    """

    def __init__(self, data: DigitsSplit, *, index: int, world: int, batch: int, seed: int) -> None:
        import torch

        if not 0 <= index < world:
            raise ValueError(f"shard index {index} outside 0..{world - 1}")
        rows = np.arange(index, len(data.y_train), world, dtype=np.int64)
        self._x = torch.from_numpy(data.x_train[rows])
        self._y = torch.from_numpy(data.y_train[rows])
        self._seed = seed
        self._index = index
        self.batch = 1
        self.set_batch(batch)
        self._iteration = 0

    @property
    def shard_size(self) -> int:
        return len(self._y)

    def set_batch(self, batch: int) -> None:
        """Draw ``batch`` samples per iteration from now on (``ctx.on_batch_size`` calls this)."""
        if type(batch) is not int or batch < 1:
            raise ValueError(f"batch size must be a positive integer, got {batch!r}")
        self.batch = batch

    def indices(self, iteration: int) -> npt.NDArray[np.int64]:
        """Rows of the shard that iteration ``iteration`` trains on."""
        rng = np.random.default_rng((self._seed, self._index, iteration))
        return rng.integers(0, len(self._y), size=self.batch, dtype=np.int64)

    def at(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of iteration ``iteration`` at the current batch size."""
        import torch

        pick = torch.from_numpy(self.indices(iteration))
        return self._x[pick], self._y[pick]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of the next iteration (counting from 0)."""
        out = self.at(self._iteration)
        self._iteration += 1
        return out
