"""encode_payload / decode_payload: one ``SparsePayload`` <-> a small meta dict plus two raw byte buffers.

The split follows the protocol's framing (``docs/dev/contracts.md``): the meta dict rides in the frame's
msgpack header, the buffers are appended out of band, so value bytes are never copied into msgpack.
Buffer order is ``[values, index]``: the fixed-width values come first so that, when the protocol aligns
the first buffer, the values are aligned too and decode can hand out a zero-copy view (the index stream
has a data-dependent length and would misalign anything after it).

Meta (all ints or str)::

    {"fmt": 1, "layer": int, "dense_len": int, "block_size": int,
     "dtype": "fp32"|"fp16"|"bf16"|"int8"|"int4"|"int2", "count": <selected blocks>,
     "index": "run"|"u32"|"d16"|"varint"|"bitmap"|"rice"}

The low-bit ``dtype``s (``wanrt.codec.lowbit``) carry codes and per-group scales in the values buffer;
they decode to an fp32 payload with the codes attached (``coded``), so a gateway that relays it unchanged
sends the very same bytes on (no requantisation, no compounding error).

Decode trusts nothing: every field's type and range, the buffer lengths implied by ``count`` and the
encodings, and finally every payload invariant via ``SparsePayload.validate`` are checked, and every size
is bounded before the array that depends on it is allocated. Everything a peer can get wrong surfaces as
a :class:`~wanrt.errors.RemoteProtocolError` subclass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

import numpy as np
import numpy.typing as npt

from wanrt.codec.index_encodings import (
    DEFAULT_CHOICES,
    INDEX_ENCODINGS,
    IndexEncoding,
    choose_encoding,
    decode_indices,
    encode_indices,
    encoded_sizes,
    gap_sum_of,
    is_run,
)
from wanrt.codec.kernel_choice import codec_kernels
from wanrt.codec.limits import (
    CODEC_VERSION,
    MAX_BLOCK_SIZE,
    MAX_DENSE_LEN,
    MAX_LAYER_ID,
    MAX_PAYLOAD_ELEMENTS,
)
from wanrt.codec.lowbit import (
    CODING_BITS,
    VALUE_CODINGS,
    LowbitValues,
    pack,
    payload_values,
    quantise_payload,
    unpack,
    usable_coded,
)
from wanrt.codec.value_casts import cast_for_wire, values_from_wire
from wanrt.errors import LimitExceeded, LocalProtocolError, MalformedPayload
from wanrt.payload import VALUE_DTYPES, SparsePayload, n_blocks

__all__ = ["META_KEYS", "decode_payload", "encode_payload"]

#: Exactly the keys of a meta dict; unknown or missing keys are a malformed payload (versioned by ``fmt``).
META_KEYS: Final = frozenset({"fmt", "layer", "dense_len", "block_size", "dtype", "count", "index"})


def encode_payload(
    p: SparsePayload, *, wire_dtype: str | None = None, index_encoding: IndexEncoding | None = None
) -> tuple[dict[str, Any], list[memoryview]]:
    """Encode ``p`` as ``(meta, [values_bytes, index_bytes])``.

    ``wire_dtype`` downcasts (or upcasts) the values on the wire; fp16 falls back to ``p``'s own dtype when
    a finite value would overflow (``meta["dtype"]`` says what was sent). A low-bit ``wire_dtype``
    (``int8``/``int4``/``int2``) sends ``p.coded`` when it describes ``p.values`` (made by
    :func:`~wanrt.codec.lowbit.quantise_payload`, whose caller kept the error), else quantises here with
    the default scale block (the error is then the caller's loss); non-finite values go in ``p``'s dtype.
    Default (None): ``p.coded``'s coding when it is usable, else ``p``'s own dtype.
    ``index_encoding`` forces an encoding (tests, benchmarks); by default the smallest is chosen per
    payload. Values in ``p``'s own dtype are not copied: the first buffer is a view of ``p.values``,
    valid as long as ``p`` is unchanged.

    Raises :class:`LocalProtocolError` when ``p`` breaks its own invariants or an option is unknown. The
    O(nnz) part of that check (sorted, unique, in range) rides on the pass that sizes the encodings, since
    a delta encoding of unsorted indices would silently decode to different ones.
    """
    coded = usable_coded(p)
    own = p.value_dtype if coded is None else coded.coding
    dtype = own if wire_dtype is None else wire_dtype
    if dtype not in VALUE_DTYPES and dtype not in CODING_BITS:
        raise LocalProtocolError("unknown wire dtype", value=wire_dtype)
    _check_shape(p)
    kernels = codec_kernels(values=p.nnz)
    nb = n_blocks(p.dense_len, p.block_size)
    ok, max_gap, varint_bytes = kernels.gap_stats(p.indices, nb)
    if not ok:
        _refuse(p, "indices not strictly increasing inside the layer")
    sizes = encoded_sizes(p.nnz_blocks, nb, max_gap, varint_bytes, is_run(p.indices), gap_sum_of(p.indices))
    lowbit = _lowbit_form(p, dtype, coded)
    if index_encoding is None:
        encoding = choose_encoding(sizes, INDEX_ENCODINGS if lowbit is not None else DEFAULT_CHOICES)
    elif index_encoding in sizes:
        encoding = index_encoding
    else:
        raise LocalProtocolError("index encoding unknown or unable to hold these", value=index_encoding)
    index = encode_indices(p.indices, nb, encoding, kernels, sizes)
    if lowbit is not None:
        values, sent_dtype = pack(lowbit), lowbit.coding
    else:  # a float dtype, or values a low-bit coding cannot hold (not finite): p's own dtype then
        to = p.value_dtype if dtype in CODING_BITS else dtype
        values, sent_dtype = cast_for_wire(p.values, p.value_dtype, to, kernels)
    meta: dict[str, Any] = {
        "fmt": CODEC_VERSION,
        "layer": p.layer,
        "dense_len": p.dense_len,
        "block_size": p.block_size,
        "dtype": sent_dtype,
        "count": p.nnz_blocks,
        "index": encoding,
    }
    return meta, [_bytes_of(values), _bytes_of(index)]


def _lowbit_form(p: SparsePayload, dtype: str, coded: LowbitValues | None) -> LowbitValues | None:
    """The codes to send for a low-bit ``dtype`` (None: not low-bit, or the values cannot be coded)."""
    if dtype not in CODING_BITS:
        return None
    if coded is not None and coded.coding == dtype:
        return coded
    q = usable_coded(quantise_payload(p, dtype))
    return q


def _refuse(p: SparsePayload, why: str) -> NoReturn:
    """Raise LocalProtocolError with validate's precise reason when it has one."""
    try:
        p.validate()
    except MalformedPayload as exc:
        raise LocalProtocolError(f"refusing to encode an invalid payload: {exc.message}") from exc
    raise LocalProtocolError(f"refusing to encode an invalid payload: {why}")


def _check_shape(p: SparsePayload) -> None:
    """The O(1) and O(block_size) invariants of ``p``, plus the format's limits."""
    if not (
        p.value_dtype in VALUE_DTYPES
        and isinstance(p.values, np.ndarray)
        and isinstance(p.indices, np.ndarray)
        and p.values.dtype == VALUE_DTYPES[p.value_dtype]
        and p.indices.dtype == np.int64
        and p.values.ndim == 1
        and p.indices.ndim == 1
        and p.values.shape[0] == p.indices.shape[0] * p.block_size
        and 0 <= p.layer <= MAX_LAYER_ID
        and 0 <= p.dense_len <= MAX_DENSE_LEN
        and 1 <= p.block_size <= MAX_BLOCK_SIZE
    ):
        _refuse(p, "shape, dtype or size outside the codec's limits")
    tail = p.dense_len % p.block_size
    nb = n_blocks(p.dense_len, p.block_size)
    in_tail = tail and p.nnz_blocks and int(p.indices[-1]) == nb - 1
    if in_tail and np.any(p.values[p.nnz - p.block_size + tail :]):
        _refuse(p, "nonzero padding beyond dense length in the tail block")


def _bytes_of(arr: npt.NDArray[Any]) -> memoryview:
    """Byte-format view of a contiguous array (no copy); ``len()`` of it is the wire size."""
    return memoryview(arr.data).cast("B")


def _short(v: Any) -> str:
    """A peer's bad value as it goes into an error (and so into logs): bounded, whatever the peer sent."""
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _int_field(meta: Mapping[str, Any], key: str, lo: int, hi: int, peer: str | None) -> int:
    v = meta[key]
    if type(v) is not int:  # bool is an int subclass; msgpack never yields one for a valid field
        raise MalformedPayload(f"meta field {key!r} must be an integer", peer=peer, value=_short(v))
    if not lo <= v <= hi:
        raise MalformedPayload(f"meta field {key!r} out of range [{lo}, {hi}]", peer=peer, value=_short(v))
    return v


def _str_field(meta: Mapping[str, Any], key: str, allowed: Sequence[str], peer: str | None) -> str:
    v = meta[key]
    if type(v) is not str or v not in allowed:
        raise MalformedPayload(
            f"meta field {key!r} must be one of {list(allowed)}", peer=peer, value=_short(v)
        )
    return v


def _byte_view(buf: Any, what: str, peer: str | None) -> memoryview:
    try:
        mv = memoryview(buf)
        if not mv.contiguous:
            raise ValueError("not contiguous")
        return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")
    except (TypeError, ValueError) as exc:
        raise MalformedPayload(f"{what} buffer is not contiguous bytes", peer=peer) from exc


def decode_payload(
    meta: Mapping[str, Any],
    buffers: Sequence[memoryview | bytes | bytearray],
    *,
    peer: str | None = None,
    max_elements: int = MAX_PAYLOAD_ELEMENTS,
) -> SparsePayload:
    """Decode and fully validate a payload received from ``peer``.

    Values are a zero-copy view of ``buffers[0]`` (read-only if the buffer is) when it is aligned for the
    dtype, else one aligned copy; keep the received buffer alive and unmodified while the payload is used.
    Raises :class:`LimitExceeded` when the payload is larger than ``max_elements`` value slots and
    :class:`MalformedPayload` for anything else that is inconsistent, always before allocating.
    """
    if not isinstance(meta, Mapping):
        raise MalformedPayload("payload meta must be a map", peer=peer, value=type(meta).__name__)
    keys = set(meta)
    if keys != META_KEYS:
        raise MalformedPayload(
            "payload meta has wrong keys",
            peer=peer,
            value=_short(sorted(map(repr, keys ^ META_KEYS))),
        )
    fmt = _int_field(meta, "fmt", 0, 1 << 31, peer)
    if fmt != CODEC_VERSION:
        raise MalformedPayload("unsupported format version", peer=peer, limit=CODEC_VERSION, value=fmt)
    layer = _int_field(meta, "layer", 0, MAX_LAYER_ID, peer)
    dense_len = _int_field(meta, "dense_len", 0, MAX_DENSE_LEN, peer)
    block_size = _int_field(meta, "block_size", 1, MAX_BLOCK_SIZE, peer)
    dtype = _str_field(meta, "dtype", (*VALUE_DTYPES, *VALUE_CODINGS), peer)
    encoding = _str_field(meta, "index", INDEX_ENCODINGS, peer)
    nb = n_blocks(dense_len, block_size)
    count = _int_field(meta, "count", 0, nb, peer)
    if count * block_size > max_elements:
        raise LimitExceeded(
            "payload has more value slots than allowed",
            name="max_elements",
            limit=max_elements,
            value=count * block_size,
            peer=peer,
        )
    if isinstance(buffers, (bytes, bytearray, memoryview, str)) or not isinstance(buffers, Sequence):
        raise MalformedPayload("payload buffers must be a sequence of two buffers", peer=peer)
    if len(buffers) != 2:
        raise MalformedPayload("payload needs exactly two buffers", peer=peer, limit=2, value=len(buffers))
    vbuf = _byte_view(buffers[0], "values", peer)
    ibuf = _byte_view(buffers[1], "index", peer)
    lowbit = None
    if dtype in CODING_BITS:
        lowbit = unpack(vbuf, dtype, count * block_size, peer=peer)  # checks the exact length first
    else:
        want = count * block_size * VALUE_DTYPES[dtype].itemsize
        if len(vbuf) != want:
            raise MalformedPayload(
                "values buffer length disagrees with count", peer=peer, limit=want, value=len(vbuf)
            )
    indices = decode_indices(ibuf, count, nb, encoding, codec_kernels(values=count * block_size), peer=peer)
    if lowbit is None:
        p = SparsePayload(layer, dense_len, block_size, indices, values_from_wire(vbuf, dtype), dtype)
    else:
        shell = SparsePayload(layer, dense_len, block_size, indices, np.zeros(0, np.float32))
        y = payload_values(shell, lowbit)
        coded = dataclasses.replace(lowbit, values=y)
        p = SparsePayload(layer, dense_len, block_size, indices, y, "fp32", coded)
    p.validate(peer=peer)
    return p
