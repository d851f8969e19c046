"""Re-coding a round's result in the trainers' low-bit values, with the gateway's own residual (issue 23).

Why. A job whose trainers push 2-bit values (``wire_dtype = "int2"``, docs/codec.md "Low-bit values") used
to get its results back in fp32: the gateways sum in fp32, and a sum of two or more contributions was sent
down the tree (and around the ring or all-pairs core) in the dtype its values have. For DiLoCo with 3 %
pseudo-gradients that was ~97 % of the WAN bytes of an outer step (tools/bench_outer.py, session 11): the
fp32 sum over the union of three sites' supports, against 2-bit values going up.

How (issue 23 item 1, "dequantise-sum-requantise per hop with its own residual"). The place that makes a
round's result — the root of a tree, or the owner of a ring / all-pairs segment — already bounds it to its
``forward_density`` top blocks (``forward_policy = "cap"``, StellaTrain §6, :mod:`gateways.rounds.aggregate`)
and keeps the rest in its per-layer residual. With ``result_coding = "wire"`` it then quantises what it
kept in the coding and scale block its trainers push (:func:`wanrt.codec.lowbit.quantise_payload`) and adds
the quantisation error ``kept - dequantised`` to that same residual, which the engine folds into the
gateway's next contribution of the layer (error feedback at the gateway, as the trainers' leader does for
its own selection: SparseLoCo's 2-bit values converge only with EF). So:

* nothing is lost: ``result + residual == sum`` up to one fp32 rounding per value (the subtraction);
* error does not compound over rounds: each round's rounding is handed on, not dropped (docs/codec.md,
  "Error per gateway hop": with a residual the error of the sum over 20 rounds is 4–5x below plain
  re-quantisation's);
* every site applies bit-identical values: one place quantises, every receiver decodes the same codes
  with the same fp32 multiply (:func:`~wanrt.codec.lowbit.payload_values`), and the place that made it
  delivers the very ``y`` it coded.

Why only together with ``cap``: a mid-rise quantiser has no zero level, so the residual is non-zero on
every value of every block it sent; without a block budget the next result would be the union of all past
supports and would grow towards the whole layer. The cap keeps each result at ``forward_density`` blocks.

Sans-IO: plain functions on payloads.
"""

from __future__ import annotations

from gateways.rounds.aggregate import aggregate
from wanrt.codec.lowbit import quantise_payload, usable_coded
from wanrt.payload import SparsePayload

__all__ = ["Coding", "requantise"]

#: a layer's low-bit coding and scale block, as its trainers' pushes carry them (``LowbitValues``)
Coding = tuple[str, int]


def requantise(
    kept: SparsePayload, rest: SparsePayload | None, coding: Coding
) -> tuple[SparsePayload, SparsePayload | None]:
    """``kept`` coded in ``coding`` and the residual grown by what the coding left out.

    Returns ``(coded, rest')`` with ``coded`` fp32 values carrying their codes (the codec sends those
    codes) and ``rest' = rest + (kept - coded)`` (``rest`` and ``kept`` have disjoint blocks: the cap's
    split). ``kept`` itself when it already carries exactly these codes (a lone contribution relayed
    whole) or cannot be coded (a value not finite or beyond 2**100: it then travels as fp32, the codec's
    own fall-back, and nothing is held back).
    """
    name, scale_block = coding
    done = usable_coded(kept)
    if kept.nnz_blocks == 0 or (done is not None and (done.coding, done.scale_block) == coding):
        return kept, rest
    q = quantise_payload(kept, name, scale_block)
    if q is kept:
        return kept, rest
    err = SparsePayload(
        kept.layer, kept.dense_len, kept.block_size, kept.indices, kept.values_f32() - q.values, "fp32"
    )
    return q, aggregate([rest, err])
