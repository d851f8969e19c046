"""The sparse (COO) gradient of one layer, as it travels from a site leader over the WAN and back.

Everything that moves a gradient (compressors, the codec, gateways, the sparse optimizers) speaks this one
type, so it is deliberately plain: a layer id, the dense length, the block size, sorted unique block
indices and the values of the selected blocks.

Layout (StellaTrain §3.2 "cache-aware" compression selects whole 16-float blocks = one 64-byte cache line):

* ``block_size`` is 16 for the cache-aware compressor and 1 for element-wise ones.
* ``indices`` are *block* indices, ``int64``, strictly increasing, each ``< n_blocks`` where
  ``n_blocks = ceil(dense_len / block_size)``.
* ``values`` has exactly ``len(indices) * block_size`` entries: block ``indices[j]`` covers dense positions
  ``indices[j]*block_size ... +block_size-1`` and takes ``values[j*block_size : (j+1)*block_size]``.
  The last block of a tensor whose length is not a multiple of ``block_size`` is padded: its positions at or
  beyond ``dense_len`` must hold zeros, so every block has the same width and kernels can reshape freely.
* ``value_dtype`` is ``"fp32"`` (``np.float32``), ``"fp16"`` (``np.float16``) or ``"bf16"`` (``np.uint16``
  holding the upper 16 bits of the fp32 pattern; NumPy has no bfloat16). Aggregation is always done in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from wanrt.errors import KernelError, MalformedPayload

__all__ = [
    "VALUE_DTYPES",
    "SparsePayload",
    "bf16_to_fp32",
    "fp32_to_bf16",
    "n_blocks",
]

#: wire name -> NumPy dtype that holds the values in memory.
VALUE_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(np.uint16),
}


def n_blocks(dense_len: int, block_size: int) -> int:
    """Number of blocks (the last one possibly partial) covering ``dense_len`` elements."""
    return -(-dense_len // block_size)


def fp32_to_bf16(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    """Round-to-nearest-even fp32 -> bf16 bit pattern (NaN stays NaN)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = np.uint16(0x7FC0)
    return out


def bf16_to_fp32(x: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    """bf16 bit pattern -> fp32 (exact)."""
    return (np.asarray(x, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


#: The last read-only payload :meth:`SparsePayload.is_finite` found finite (see there).
_known_finite: SparsePayload | None = None


@dataclass(frozen=True, slots=True, eq=False)
class SparsePayload:
    """The COO gradient of one layer. See the module docstring for the layout invariants."""

    layer: int
    dense_len: int
    block_size: int
    indices: npt.NDArray[np.int64]
    values: npt.NDArray[Any]
    value_dtype: str = "fp32"
    #: the exact low-bit wire form of ``values`` (a ``wanrt.codec.lowbit.LowbitValues``), or None. Set by
    #: ``quantise_payload`` and by the decoder of a low-bit payload; the codec sends these codes instead of
    #: quantising again, but only while ``coded.values is values`` (a payload rebuilt with other values
    #: never goes out with stale codes). Typed ``object`` so this ground-floor module needs no codec import.
    coded: object | None = None
    #: True once :meth:`validate` passed on this very object (the codec validates all it decodes, on the
    #: link thread), so a consumer that trusts it (a sparse optimizer's upload to the GPU) need not check
    #: the indices again on the step's path; :meth:`carry_validation` passes it to a payload rebuilt with
    #: a copy of the same indices. Not an ``__init__`` argument, so ``dataclasses.replace`` (which may
    #: change the indices) never copies it. False means "unknown", not "invalid".
    validated: bool = field(default=False, init=False, compare=False, repr=False)

    @property
    def nnz_blocks(self) -> int:
        return int(self.indices.shape[0])

    @property
    def nnz(self) -> int:
        """Number of transmitted value slots (``nnz_blocks * block_size``, padding included)."""
        return int(self.values.shape[0])

    def values_f32(self) -> npt.NDArray[np.float32]:
        """Values as fp32 (no copy when they already are)."""
        if self.value_dtype == "fp32":
            return self.values
        if self.value_dtype == "fp16":
            return self.values.astype(np.float32)
        return bf16_to_fp32(self.values)

    def is_finite(self) -> bool:
        """True unless a value is NaN or ±Inf. One pass, no layer-sized copy.

        16-bit values are checked on their bits: NaN/Inf are the patterns whose magnitude bits are at least
        the all-ones exponent, so the largest magnitude says it (``np.isfinite`` on fp16 widens every
        element: ~10x slower, a tenth of a gateway's CPU per round). A read-only payload found finite is
        remembered (the last one, by identity): a decoded result is shared read-only by every receiver of
        the same bytes (``wanrt.protocol``), and the simulator's 1 000 gateways would otherwise check one
        result a thousand times per round."""
        global _known_finite
        if _known_finite is self:
            return True
        ok = self._values_finite()
        if ok and not (self.values.flags.writeable or self.indices.flags.writeable):
            _known_finite = self
        return ok

    def _values_finite(self) -> bool:
        if self.value_dtype == "fp32":
            return bool(np.isfinite(self.values).all())
        if self.values.shape[0] == 0:
            return True
        inf = 0x7F80 if self.value_dtype == "bf16" else 0x7C00
        bits = self.values.view(np.uint16)
        # in cache-sized slices through one small scratch: a layer-sized temporary is fresh memory the
        # kernel must fault in (5x slower than the check itself on a loaded machine)
        step = 1 << 16
        scratch = np.empty(min(step, bits.shape[0]), np.uint16)
        for i in range(0, bits.shape[0], step):
            part = bits[i : i + step]
            out = scratch[: part.shape[0]]
            np.bitwise_and(part, np.uint16(0x7FFF), out=out)
            if int(out.max()) >= inf:
                return False
        return True

    def carry_validation(self, source: SparsePayload) -> SparsePayload:
        """Say this payload is validated when ``source`` was and this one has its shape: the caller
        promises that these indices are ``source``'s (the same array or an exact copy), as the client's
        apply does when it averages a decoded result into its own buffers. Returns ``self``."""
        same = (
            self.dense_len == source.dense_len
            and self.block_size == source.block_size
            and self.nnz_blocks == source.nnz_blocks
            and self.nnz == source.nnz
        )
        if source.validated and same:
            object.__setattr__(self, "validated", True)
        return self

    def validate(self, *, peer: str | None = None) -> None:
        """Check every invariant; raise :class:`MalformedPayload` naming the first one that fails.

        O(nnz). Called by the codec on everything that comes off the wire, so a lying peer cannot make a
        gateway scatter out of bounds or double-count an index.
        """

        def bad(msg: str, **f: Any) -> MalformedPayload:
            return MalformedPayload(f"layer {self.layer}: {msg}", peer=peer, **f)

        if self.layer < 0:
            raise bad("negative layer id", value=self.layer)
        if self.block_size < 1:
            raise bad("block_size must be >= 1", value=self.block_size)
        if self.dense_len < 0:
            raise bad("negative dense length", value=self.dense_len)
        if self.value_dtype not in VALUE_DTYPES:
            raise bad("unknown value dtype", value=self.value_dtype)
        if self.values.dtype != VALUE_DTYPES[self.value_dtype]:
            raise bad("values dtype disagrees with value_dtype", value=str(self.values.dtype))
        if self.indices.ndim != 1 or self.values.ndim != 1:
            raise bad("indices and values must be 1-D")
        if self.indices.dtype != np.int64:
            raise bad("indices must be int64", value=str(self.indices.dtype))
        count = self.indices.shape[0]
        if self.values.shape[0] != count * self.block_size:
            raise bad(
                "value count disagrees with index count",
                limit=count * self.block_size,
                value=int(self.values.shape[0]),
            )
        if count == 0:
            object.__setattr__(self, "validated", True)
            return
        nb = n_blocks(self.dense_len, self.block_size)
        if int(self.indices[0]) < 0 or int(self.indices[-1]) >= nb:
            raise bad("block index out of range", limit=nb, value=int(self.indices[-1]))
        if count > 1 and not bool(np.all(self.indices[1:] > self.indices[:-1])):
            raise bad("indices not strictly increasing")
        tail = self.dense_len % self.block_size
        if tail and int(self.indices[-1]) == nb - 1:
            pad = self.values[(count - 1) * self.block_size + tail :]
            if np.any(pad != 0):
                raise bad("nonzero padding beyond dense length in the tail block")
        object.__setattr__(self, "validated", True)  # (a memo on a frozen object: see the field)

    def to_dense(self, out: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.float32]:
        """Scatter into a dense fp32 vector (``out`` is zeroed first when given)."""
        if out is None:
            out = np.zeros(self.dense_len, dtype=np.float32)
        else:
            if out.shape != (self.dense_len,):
                raise KernelError("output has the wrong shape", value=out.shape)
            out.fill(0)
        self.add_into(out)
        return out

    def add_into(self, dense: npt.NDArray[np.float32], scale: float = 1.0) -> None:
        """``dense += scale * self`` over the selected blocks only (cost proportional to nnz)."""
        if self.nnz_blocks == 0:
            return
        bs = self.block_size
        vals = self.values_f32()
        if scale != 1.0:
            vals = vals * np.float32(scale)
        full = self.dense_len // bs
        if self.dense_len % bs and int(self.indices[-1]) == full:
            # tail block: only the positions inside the tensor
            tail = self.dense_len - full * bs
            dense[full * bs :] += vals[(self.nnz_blocks - 1) * bs : (self.nnz_blocks - 1) * bs + tail]
            idx = self.indices[:-1]
            vals = vals[: (self.nnz_blocks - 1) * bs]
        else:
            idx = self.indices
        if idx.shape[0] == 0:
            return
        if bs == 1:
            dense[idx] += vals
        else:
            view = dense[: full * bs].reshape(full, bs)
            view[idx] += vals.reshape(-1, bs)

    @classmethod
    def empty(cls, layer: int, dense_len: int, block_size: int, value_dtype: str = "fp32") -> SparsePayload:
        return cls(
            layer,
            dense_len,
            block_size,
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=VALUE_DTYPES[value_dtype]),
            value_dtype,
        )

    @classmethod
    def from_dense_blocks(
        cls,
        layer: int,
        dense: npt.NDArray[np.float32],
        block_indices: npt.NDArray[np.integer[Any]],
        block_size: int,
    ) -> SparsePayload:
        """Gather the given (sorted, unique) blocks of ``dense`` into a payload (tail block zero-padded)."""
        dense_len = int(dense.shape[0])
        idx = np.asarray(block_indices, dtype=np.int64)
        bs = block_size
        full = dense_len // bs
        if dense_len % bs == 0 or idx.shape[0] == 0 or int(idx[-1]) < full:
            vals = dense[: full * bs].reshape(full, bs)[idx].reshape(-1) if bs > 1 else dense[idx]
        else:
            head = dense[: full * bs].reshape(full, bs)[idx[:-1]].reshape(-1)
            tail = np.zeros(bs, dtype=np.float32)
            tail[: dense_len - full * bs] = dense[full * bs :]
            vals = np.concatenate([head, tail])
        return cls(layer, dense_len, bs, idx, np.ascontiguousarray(vals, dtype=np.float32), "fp32")
