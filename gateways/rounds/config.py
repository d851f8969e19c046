"""Timeouts, windows and forwarding policy of the gateway's round engine (:mod:`gateways.rounds.engine`).

A frozen dataclass with defaults, validated on construction, so the gateway's TOML section
(``[gateway.rounds]``) can be mapped onto it with :func:`wanrt.config.from_mapping` and a bad value is
reported with the key that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from gateways.rounds.topology import TOPOLOGY_KINDS, PlanSpec, TopologyKind
from wanrt.config import check

__all__ = ["MAX_LAYERS", "ForwardPolicy", "ResultCoding", "RoundConfig"]

ForwardPolicy: TypeAlias = Literal["exact", "per_site", "cap"]
ResultCoding: TypeAlias = Literal["exact", "wire"]

#: Round state is kept per (iteration, layer); the layer id is a peer-supplied number, so it is bounded to
#: keep the engine's memory bounded (ViT-L has ~300 parameter tensors, LLMs a few thousand).
MAX_LAYERS: Final = 1 << 16


@dataclass(frozen=True)
class RoundConfig:
    """Settings of one gateway's round engine.

    * ``round_deadline_s`` — how long a parent waits (from opening the round) for its own trainers and
      for each child subtree per level of that subtree's height, then proceeds without it (STAR §IV-B
      x-order).
    * ``t_w_s`` — how long a parent waits after its own trainers' push for a straggler attached to it
      (STAR §IV-B parent–child); usually much shorter than the round deadline.
    * ``suspect_after_s`` — how long to wait on a peer that cannot be skipped (ring neighbour, parent's
      final result) before emitting ``PeerSuspect`` so the daemon can decide to declare it lost.
    * ``window`` — how many iterations beyond the newest one seen a peer may be; partial staleness is at
      most 1 (StellaTrain §3.3), so ``staleness + 2`` suffices; beyond is a protocol error.
    * ``max_lag`` — how many iterations behind a peer message may still be (late contributions on slow
      links are legal and ignored; older is a protocol error). Also the age at which unresolved rounds are
      abandoned, which bounds memory.
    * ``retain_finals`` — iterations for which final results are kept to answer peers that re-run a round
      after a plan change (a finished round's result always wins over a re-run).
    * ``outcome_history`` — iterations for which this site's own contributions counted in results here are
      kept (with their payloads) after the results: if it was cut off right after finishing a round, the
      others may have re-run it without them, and the rejoin's ``outcome`` says so later.
    * ``outcome_ranges`` — the peers' contributions counted in results here are remembered from the
      engine's start as ranges of iterations (:mod:`gateways.rounds.counted_log`), so a site that rejoins
      after a restart or a partition, however long, learns which of its contributions were counted; this
      bounds the ranges per (site, layer) — one per outage of that site, not per iteration.
    * ``forward_policy`` / ``forward_density`` — bounded forwarding (see :mod:`gateways.rounds.aggregate`):
      ``exact`` forwards unions unchanged, ``per_site`` trims each site's own contribution to
      ``ceil(density·n_blocks/N)`` blocks (StellaTrain §6), ``cap`` re-sparsifies every final to
      ``ceil(density·n_blocks)`` blocks; what is not forwarded stays in a per-layer residual.
    * ``quorum`` — minimum members of a plan for rounds to complete (0 = a majority of the job's sites), so
      a site cut off from the others does not train alone and diverge.
    * ``max_buffered`` — per peer, messages kept while this gateway has not yet adopted the plan they were
      sent under (dropping one is safe: its originators keep their contributions).
    * ``partial_sums`` — ``wire`` (default): partial sums, ring segments and results travel every WAN hop
      in the dtype the site's trainers push (fp16/bf16 halve the bytes; each hop rounds its fp32 sum once,
      so an N-hop result carries up to N roundings of relative error ~2^-11 (fp16) / 2^-8 (bf16) on top of
      the trainers' own); ``fp32``: keep partial sums in fp32 on the WAN (twice the bytes of fp16, exact
      sums of the pushed values). Sums are computed in fp32 either way, and every site gets the same
      bit-identical result.
    * ``allpairs_direct`` — under the ``allpairs`` topology, a round whose contributions are all sparse
      (density ≤ 1/(N(N-1)) at every core member) sends each contribution whole to every member and is
      finished in one hop, without the all-gather (see :mod:`gateways.rounds.allpairs`); ``false`` always
      runs the two-hop reduce-scatter + all-gather.
    * ``allpairs_chunk_bytes`` — under ``allpairs``, a two-hop round cuts every segment into pieces of
      about this many bytes of dense fp32 values (half that on the wire in fp16) and runs the
      reduce-scatter and all-gather per piece (cut-through, :mod:`gateways.rounds.allpairs`): an owner sums
      and sends on piece k while piece k+1 is still arriving, so the two WAN hops and the sums overlap
      instead of each waiting for a whole segment. 0 turns it off (one piece per segment); with
      ``forward_policy = "cap"`` a segment is always one piece (the cap is per segment). Every gateway of a
      job must use the same value: a piece outside the receiver's cut is refused.
    * ``stream_results`` — under ``allpairs`` with cut-through, every finished piece of a dense layer's
      result goes to the trainer as soon as it is final here (``DeliverPiece``,
      :mod:`wanrt.protocol.streamed_results`), so the trainer has all but the last piece when the round
      ends instead of receiving and decoding the whole layer after it; ``false`` delivers results whole.
    * ``result_coding`` — ``exact`` (default): a result made of two or more low-bit contributions travels
      as their exact fp32 sum; ``wire``: the place that makes a result (tree root, ring or all-pairs
      segment owner) re-codes it in the low-bit coding its trainers push, and keeps the coding's error in
      its per-layer residual (:mod:`gateways.rounds.result_coding`, issue 23). Needs ``forward_policy =
      "cap"`` (the budget that keeps a result from growing over the residual's support). Every site still
      gets bit-identical values: one place codes them.
    * ``topology`` / ``tree_arity`` — the default :class:`~gateways.rounds.topology.PlanSpec` (see
    :meth:`spec`).
    """

    round_deadline_s: float = 1.0
    t_w_s: float = 0.1
    suspect_after_s: float = 5.0
    window: int = 3
    max_lag: int = 64
    retain_finals: int = 8
    outcome_history: int = 64
    outcome_ranges: int = 256
    forward_policy: ForwardPolicy = "exact"
    forward_density: float = 0.01
    result_coding: ResultCoding = "exact"
    quorum: int = 0
    max_buffered: int = 1024
    topology: TopologyKind = "tree"
    tree_arity: int = 2
    partial_sums: str = "wire"
    allpairs_direct: bool = True
    allpairs_chunk_bytes: int = 1 << 20
    stream_results: bool = True

    def __post_init__(self) -> None:
        check(0 < self.round_deadline_s <= 3600, "round_deadline_s", self.round_deadline_s, "0 < s <= 3600")
        check(0 <= self.t_w_s <= 3600, "t_w_s", self.t_w_s, "0 <= s <= 3600")
        check(0 < self.suspect_after_s <= 86400, "suspect_after_s", self.suspect_after_s, "0 < s <= 86400")
        check(1 <= self.window <= 64, "window", self.window, "1..64 iterations")
        check(self.window <= self.max_lag <= 1 << 20, "max_lag", self.max_lag, f"{self.window}..2**20")
        check(self.window <= self.retain_finals <= self.max_lag, "retain_finals", self.retain_finals, "")
        check(0 <= self.outcome_history <= 1 << 20, "outcome_history", self.outcome_history, "0..2**20")
        check(1 <= self.outcome_ranges <= 1 << 16, "outcome_ranges", self.outcome_ranges, "1..2**16")
        check(
            self.forward_policy in ("exact", "per_site", "cap"),
            "forward_policy",
            self.forward_policy,
            "exact, per_site or cap",
        )
        check(self.result_coding in ("exact", "wire"), "result_coding", self.result_coding, "exact or wire")
        check(
            self.result_coding == "exact" or self.forward_policy == "cap",
            "result_coding",
            self.result_coding,
            'needs forward_policy = "cap" (a re-coded result keeps a residual on every block it sent)',
        )
        check(0 < self.forward_density <= 1, "forward_density", self.forward_density, "0 < d <= 1")
        check(0 <= self.quorum <= 1 << 16, "quorum", self.quorum, "0 (majority) or a site count")
        check(1 <= self.max_buffered <= 1 << 20, "max_buffered", self.max_buffered, "1..2**20")
        check(self.topology in TOPOLOGY_KINDS, "topology", self.topology, f"one of {TOPOLOGY_KINDS}")
        check(1 <= self.tree_arity <= 1024, "tree_arity", self.tree_arity, "1..1024")
        check(self.partial_sums in ("wire", "fp32"), "partial_sums", self.partial_sums, "wire or fp32")
        check(
            isinstance(self.allpairs_direct, bool), "allpairs_direct", self.allpairs_direct, "true or false"
        )
        check(isinstance(self.stream_results, bool), "stream_results", self.stream_results, "true or false")
        check(
            type(self.allpairs_chunk_bytes) is int
            and (self.allpairs_chunk_bytes == 0 or 1 << 12 <= self.allpairs_chunk_bytes <= 1 << 30),
            "allpairs_chunk_bytes",
            self.allpairs_chunk_bytes,
            "0 (off) or 4 KiB..1 GiB",
        )

    def spec(self) -> PlanSpec:
        """The plan inputs this config asks for, before any cost estimate or straggler is known."""
        return PlanSpec(self.topology, self.tree_arity)
