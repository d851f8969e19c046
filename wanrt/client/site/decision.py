"""What the site leader tells its ranks after each step, as plain integer and float arrays.

Every rank of a site must apply the same updates at the same step and switch configuration at the same
iteration, so the leader decides and broadcasts its decision over torch.distributed. The decision travels as
three flat arrays (an ``int64`` header of fixed size, an ``int64`` body, a ``float32`` value array) rather
than pickled objects: broadcast of fixed-dtype tensors works on gloo and NCCL alike, costs one copy, and the
receiving side can bound every size before it allocates (pickle could run arbitrary code and allocate
anything).

Layout of the body: one row of :data:`UPDATE_FIELDS` per update, then all block indices, then one row of
:data:`CONFIG_FIELDS` per configuration change (the density, the batch weight and the learning-rate scale
travel as the bit patterns of float64s), then the UTF-8 bytes of an error ``kind\\0message`` one per element.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from wanrt.errors import LimitExceeded, MalformedPayload
from wanrt.payload import SparsePayload
from wanrt.protocol.job_settings import OUTER_CODINGS, TrainerSettings

__all__ = [
    "CONFIG_FIELDS",
    "HEADER_LEN",
    "MAGIC",
    "OWN_IN_FLIGHT",
    "UPDATE_FIELDS",
    "ConfigChange",
    "SiteDecision",
    "SiteUpdate",
    "decode_body",
    "decode_header",
    "encode",
]

MAGIC: Final = 0x57414E52  # "WANR": a rank that joined the wrong collective sequence fails loudly
HEADER_LEN: Final = 8
UPDATE_FIELDS: Final = 6  # iteration, layer, dense_len, block_size, nnz_blocks, n_sites
#: ``n_sites`` of a row that is the site's own in-flight payload (``SiteDecision.predict``), not a job update
OWN_IN_FLIGHT: Final = 0
#: effective_iteration, density bits (NaN = unchanged), batch_size, staleness (-1), batch_weight bits (NaN),
#: restart rank (-1 = none), local_steps (-1 = unchanged), lr_scale bits (NaN = unchanged), outer_steps (-1),
#: fragments (-1), outer_coding as its index in OUTER_CODINGS (-1)
CONFIG_FIELDS: Final = 11
#: an error message longer than this is cut: it is for humans, and it must not size an allocation
MAX_ERROR_BYTES: Final = 4096
#: at most this many configuration changes per step; the scheduler announces a handful per minute
MAX_CONFIG_CHANGES: Final = 64


@dataclass(frozen=True)
class ConfigChange:
    """A scheduler decision: from ``effective_iteration`` on, use these values (``None`` = unchanged)."""

    effective_iteration: int
    density: float | None = None
    batch_size: int | None = None
    staleness: int | None = None
    #: this site's share of the job's samples × the number of sites (1 = an equal share): its gradient is
    #: scaled by it before the sum across sites, so the job's update averages samples, not sites
    batch_weight: float | None = None
    #: the scheduler's KILL_RESTART order (AntDT §V-E3): this rank of the site restarts at the iteration
    restart: int | None = None
    #: local micro-steps per WAN iteration from this iteration on (ElasticBSP §4, ZipLine's choice)
    local_steps: int | None = None
    #: the job's factor on the user's learning rate from this iteration on (STAR §IV-C's ADJUST_LR, announced
    #: with local steps: docs/local_steps.md); the same at every site
    lr_scale: float | None = None
    #: the outer loop's mode from this iteration on (docs/scheduler.md "The mode choice"): inner steps per
    #: outer step (1 = per-step exchange), fragments (1 = plain DiLoCo), the pseudo-gradient's coding
    outer_steps: int | None = None
    fragments: int | None = None
    outer_coding: str | None = None

    @classmethod
    def of(cls, effective_iteration: int, s: TrainerSettings) -> ConfigChange:
        """The change a ConfigUpdate's settings (read by :mod:`wanrt.protocol.job_settings`) make from
        ``effective_iteration`` on, in the form the site broadcast packs (:data:`CONFIG_FIELDS`)."""
        return cls(
            effective_iteration,
            None if s.density is None else float(s.density),
            s.batch_size,
            s.staleness,
            None if s.batch_weight is None else float(s.batch_weight),
            s.restart,
            s.local_steps,
            None if s.lr_scale is None else float(s.lr_scale),
            s.outer_steps,
            s.fragments,
            s.outer_coding,
        )


@dataclass(frozen=True)
class SiteUpdate:
    """The summed sparse update of one layer for one iteration and how many sites contributed to it."""

    iteration: int
    layer: int
    n_sites: int
    payload: SparsePayload  # fp32 values, summed (not averaged)


@dataclass(frozen=True)
class SiteDecision:
    updates: list[SiteUpdate] = field(default_factory=list)
    config_changes: list[ConfigChange] = field(default_factory=list)
    error: tuple[str, str] | None = None  # (exception class name, message)
    #: the job's parameters follow (one broadcast per parameter, into every rank's own tensors) and are
    #: installed before ``updates`` are applied: a parameter resync (wanrt.client.link.param_resync)
    snapshot: bool = False
    #: the iteration that just ended was pushed empty (a parameter snapshot was pending): its samples
    #: contributed nothing, so every rank counts it and a shard sampler does not report them
    discarded: bool = False
    #: the site's own payloads still in flight (pushed, their job update not applied yet): every rank moves
    #: its parameters by them until the next step (wanrt.client.site.prediction). On the wire they are update
    #: rows with ``n_sites`` 0, which no job update can have
    predict: list[SiteUpdate] = field(default_factory=list)


def encode(
    decision: SiteDecision,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Flatten a decision into (header, body, values)."""
    ups = decision.updates + [
        SiteUpdate(u.iteration, u.layer, OWN_IN_FLIGHT, u.payload) for u in decision.predict
    ]
    meta = np.array(
        [
            (u.iteration, u.layer, u.payload.dense_len, u.payload.block_size, u.payload.nnz_blocks, u.n_sites)
            for u in ups
        ],
        dtype=np.int64,
    ).reshape(-1, UPDATE_FIELDS)
    indices = [u.payload.indices for u in ups]
    values = [u.payload.values_f32() for u in ups]
    cfg = np.zeros((len(decision.config_changes), CONFIG_FIELDS), dtype=np.int64)
    for row, c in zip(cfg, decision.config_changes, strict=True):
        floats = np.array(
            [
                np.nan if c.density is None else c.density,
                np.nan if c.batch_weight is None else c.batch_weight,
                np.nan if c.lr_scale is None else c.lr_scale,
            ],
            dtype=np.float64,
        ).view(np.int64)
        row[:] = (
            c.effective_iteration,
            int(floats[0]),
            -1 if c.batch_size is None else c.batch_size,
            -1 if c.staleness is None else c.staleness,
            int(floats[1]),
            -1 if c.restart is None else c.restart,
            -1 if c.local_steps is None else c.local_steps,
            int(floats[2]),
            -1 if c.outer_steps is None else c.outer_steps,
            -1 if c.fragments is None else c.fragments,
            -1 if c.outer_coding is None else OUTER_CODINGS.index(c.outer_coding),
        )
    err = b""
    if decision.error is not None:
        err = (decision.error[0] + "\0" + decision.error[1]).encode("utf-8", "replace")[:MAX_ERROR_BYTES]
    err_arr = np.frombuffer(err, dtype=np.uint8).astype(np.int64)
    n_idx = sum(int(i.shape[0]) for i in indices)
    body = np.concatenate([meta.reshape(-1), *indices, cfg.reshape(-1), err_arr]).astype(np.int64)
    vals = np.concatenate(values).astype(np.float32) if values else np.zeros(0, dtype=np.float32)
    header = np.array(
        [
            MAGIC,
            len(ups),
            n_idx,
            int(vals.shape[0]),
            cfg.shape[0],
            len(err),
            body.shape[0],
            int(decision.snapshot) | (int(decision.discarded) << 1),
        ],
        dtype=np.int64,
    )
    return header, body, vals


def decode_header(header: npt.NDArray[np.int64], *, max_elements: int) -> tuple[int, int]:
    """Check the header and return the (body, values) lengths to receive next, bounded before allocation."""
    if header.shape != (HEADER_LEN,) or int(header[0]) != MAGIC:
        raise MalformedPayload("site leader broadcast is out of sequence (bad header)")
    n_up, n_idx, n_val, n_cfg, n_err, n_body = (int(x) for x in header[1:7])
    for name, value, limit in (
        ("updates", n_up, max_elements),
        ("indices", n_idx, max_elements),
        ("values", n_val, max_elements),
        ("config_changes", n_cfg, MAX_CONFIG_CHANGES),
        ("error_bytes", n_err, MAX_ERROR_BYTES),
    ):
        if not 0 <= value <= limit:
            raise LimitExceeded(
                f"site broadcast: {name} {value} exceeds {limit}", name=name, limit=limit, value=value
            )
    if int(header[7]) not in (0, 1, 2, 3):
        raise MalformedPayload("site broadcast: bad snapshot/discarded flags")
    if n_body != n_up * UPDATE_FIELDS + n_idx + n_cfg * CONFIG_FIELDS + n_err:
        raise MalformedPayload("site broadcast: body length disagrees with the header")
    return n_body, n_val


def decode_body(
    header: npt.NDArray[np.int64], body: npt.NDArray[np.int64], values: npt.NDArray[np.float32]
) -> SiteDecision:
    """Rebuild the decision; every payload is validated so a torn broadcast cannot corrupt parameters."""
    n_up, n_idx, n_val, n_cfg, n_err = (int(x) for x in header[1:6])
    meta = body[: n_up * UPDATE_FIELDS].reshape(n_up, UPDATE_FIELDS)
    pos = n_up * UPDATE_FIELDS
    vpos = 0
    updates: list[SiteUpdate] = []
    predict: list[SiteUpdate] = []
    for it, layer, dense_len, bs, nnz, n_sites in (tuple(int(x) for x in row) for row in meta):
        if nnz < 0 or bs < 1 or pos + nnz > n_up * UPDATE_FIELDS + n_idx or vpos + nnz * bs > n_val:
            raise MalformedPayload("site broadcast: update sizes disagree with the header", layer=layer)
        p = SparsePayload(layer, dense_len, bs, body[pos : pos + nnz].copy(), values[vpos : vpos + nnz * bs])
        p.validate()
        (predict if n_sites == OWN_IN_FLIGHT else updates).append(SiteUpdate(it, layer, n_sites, p))
        pos += nnz
        vpos += nnz * bs
    if pos != n_up * UPDATE_FIELDS + n_idx or vpos != n_val:
        raise MalformedPayload("site broadcast: update sizes disagree with the header")
    changes = []
    for row in body[pos : pos + n_cfg * CONFIG_FIELDS].reshape(n_cfg, CONFIG_FIELDS):
        density = float(row[1:2].view(np.float64)[0])
        weight = float(row[4:5].view(np.float64)[0])
        lr_scale = float(row[7:8].view(np.float64)[0])
        coding = int(row[10])
        if not -1 <= coding < len(OUTER_CODINGS):
            raise MalformedPayload("site broadcast: unknown outer coding", value=coding)
        changes.append(
            ConfigChange(
                int(row[0]),
                None if np.isnan(density) else density,
                None if row[2] < 0 else int(row[2]),
                None if row[3] < 0 else int(row[3]),
                None if np.isnan(weight) else weight,
                None if row[5] < 0 else int(row[5]),
                None if row[6] < 0 else int(row[6]),
                None if np.isnan(lr_scale) else lr_scale,
                None if row[8] < 0 else int(row[8]),
                None if row[9] < 0 else int(row[9]),
                None if coding < 0 else OUTER_CODINGS[coding],
            )
        )
    pos += n_cfg * CONFIG_FIELDS
    error = None
    if n_err:
        text = body[pos : pos + n_err].astype(np.uint8).tobytes().decode("utf-8", "replace")
        kind, _, message = text.partition("\0")
        error = (kind, message)
    flags = int(header[7])
    return SiteDecision(
        updates, changes, error, snapshot=bool(flags & 1), discarded=bool(flags & 2), predict=predict
    )
