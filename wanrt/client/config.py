"""The trainer client's settings: one frozen dataclass, validated on construction.

The same dataclass describes the sparse path and the dense baseline (:meth:`ClientConfig.dense_baseline`),
so the demo compares two runs of the *same* code that differ only in these values, never two code paths.
Settings the scheduler may change while training runs (density, staleness bound, batch size, local steps)
are announced with an effective iteration and swapped in with :func:`dataclasses.replace` at that iteration
on every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from wanrt.config import check
from wanrt.protocol.job_settings import MAX_LOCAL_STEPS, MAX_STALENESS

__all__ = ["LOWBIT_WIRE", "MAX_LOCAL_STEPS", "MAX_STALENESS", "ClientConfig", "CompressorKind", "WireDtype"]

CompressorKind = Literal["threshold_v_block", "threshold_v", "topk", "randomk"]
WireDtype = Literal["fp32", "fp16", "bf16", "int8", "int4", "int2"]
#: the wire dtypes that are low-bit value codings (``wanrt.codec.lowbit``; negotiated with the gateway)
LOWBIT_WIRE: tuple[WireDtype, ...] = ("int8", "int4", "int2")


@dataclass(frozen=True)
class ClientConfig:
    """Settings of one trainer process; every rank of a site must use the same values."""

    #: fraction of gradient elements sent per layer and iteration (1.0 = dense)
    density: float = 0.01
    #: elements per selected block; 16 fp32 = one 64-byte cache line (StellaTrain §3.2)
    block_size: int = 16
    compressor: CompressorKind = "threshold_v_block"
    #: dtype of gradient values on the wire; aggregation is always fp32. ``int8``/``int4``/``int2``: low-bit
    #: codes with one scale byte per ``scale_block`` values, the quantisation error kept in the
    #: error-feedback residual (docs/codec.md, "Low-bit values"); the gateway must support the coding
    #: (checked in the handshake: :class:`wanrt.errors.UnsupportedValueCoding`)
    wire_dtype: WireDtype = "fp32"
    #: values per scale byte of a low-bit ``wire_dtype`` (16: one cache-line block; 1/16 byte per value)
    scale_block: int = 16
    #: keep what compression left out and add it to the next gradient (nothing is silently lost)
    error_feedback: bool = True
    #: a dense layer whose wire values take at least this many bytes is cast into a buffer the leader
    #: reuses once the link has let go of the previous push (written and acknowledged), instead of a fresh
    #: array every step: a fresh 50 MB array is a new mmap whose page faults cost more than the cast
    #: (docs/round_bench.md, "Through the client"); 0 = never reuse
    reuse_wire_buffer_bytes: int = 4 << 20
    #: CUDA parameters: host memory the apply may pin for its per-layer update buffers (each layer's
    #: averaged update is written there and sent with one DMA, docs/kernels.md "On a GPU"); layers past
    #: it are staged the ordinary way (a copy into the optimizer's own few pinned slots). Pinned memory
    #: cannot be swapped, and a dense model's updates are the model's size. 0 = never pin per layer
    pinned_update_bytes: int = 1 << 30
    #: how many iterations a layer's update may lag (0 = synchronous, 1 = StellaTrain's partial staleness)
    staleness: int = 1
    #: with staleness, take each gradient at the weights the in-flight updates are about to produce,
    #: estimated by the site's own payloads (SpecTrain's weight prediction; SGD only): without it the
    #: one-step delay halves SGD's stable learning rate and the loss spikes (docs/client.md)
    weight_prediction: bool = True
    #: local micro-steps per WAN iteration (ElasticBSP §4: a worker's iterations between two barriers):
    #: the first k−1 ``step()`` calls only accumulate gradients (no exchange, no parameter change,
    #: ``zero_grad()`` keeps them), the k-th pushes the site's mean over the k micro-steps once. 1 = one
    #: exchange per step (docs/local_steps.md); the scheduler may change it per site (``local_steps@<site>``)
    local_steps: int = 1
    #: longest wait for a layer's update that can no longer be deferred
    update_deadline_s: float = 120.0
    #: connect + handshake with the gateway
    connect_timeout_s: float = 10.0
    #: phased close: flush pushes, say Bye, close the socket
    close_timeout_s: float = 10.0
    #: largest layer (elements) the leader accepts in an update from the gateway; bounds allocations
    max_layer_elements: int = 1 << 31
    #: how long the link keeps redialling a gateway it lost (restarted) before it fails with PeerLost;
    #: 0 fails at once (docs/client_reconnect.md)
    reconnect_s: float = 120.0
    #: what the rank the scheduler orders restarted (KILL_RESTART, AntDT §V-E3) does at the order's
    #: effective iteration: ``on_restart(rank, iteration)`` on that rank, the others carry on (the hook must
    #: keep the rank in the site's collectives, e.g. log and return). None (the default): every rank of the
    #: site closes the context cleanly and raises :class:`wanrt.errors.RestartRequested` out of ``step()``,
    #: so the process exits and ``torchrun --max-restarts=N`` starts the worker group again, which rejoins
    #: the job with its current parameters (docs/stragglers.md, "KILL_RESTART")
    on_restart: Callable[[int, int], None] | None = None

    def __post_init__(self) -> None:
        check(0.0 < self.density <= 1.0, "density", self.density, "must be in (0, 1]")
        check(1 <= self.block_size <= 4096, "block_size", self.block_size, "must be in [1, 4096]")
        check(
            self.wire_dtype in ("fp32", "fp16", "bf16", *LOWBIT_WIRE),
            "wire_dtype",
            self.wire_dtype,
            "one of fp32, fp16, bf16, int8, int4, int2",
        )
        check(
            type(self.scale_block) is int and 1 <= self.scale_block <= 4096,
            "scale_block",
            self.scale_block,
            "an integer in [1, 4096]",
        )
        check(
            0 <= self.staleness <= MAX_STALENESS,
            "staleness",
            self.staleness,
            f"must be in [0, {MAX_STALENESS}]",
        )
        check(
            type(self.local_steps) is int and 1 <= self.local_steps <= MAX_LOCAL_STEPS,
            "local_steps",
            self.local_steps,
            f"an integer in [1, {MAX_LOCAL_STEPS}]",
        )
        for key in ("update_deadline_s", "connect_timeout_s", "close_timeout_s"):
            value = getattr(self, key)
            check(value > 0, key, value, "must be > 0 seconds")
        check(0 <= self.reconnect_s <= 86_400, "reconnect_s", self.reconnect_s, "must be in [0, 86400] s")
        check(
            self.on_restart is None or callable(self.on_restart),
            "on_restart",
            self.on_restart,
            "a callable (rank, iteration) or None",
        )
        check(
            self.reuse_wire_buffer_bytes >= 0,
            "reuse_wire_buffer_bytes",
            self.reuse_wire_buffer_bytes,
            "must be >= 0 (0: never reuse)",
        )
        check(
            self.pinned_update_bytes >= 0,
            "pinned_update_bytes",
            self.pinned_update_bytes,
            "must be >= 0 (0: never pin per layer)",
        )
        check(self.max_layer_elements >= 1, "max_layer_elements", self.max_layer_elements, "must be >= 1")
        if self.compressor == "threshold_v_block":
            check(
                self.block_size > 1 or self.density == 1.0,
                "block_size",
                self.block_size,
                "threshold_v_block selects cache-line blocks; use compressor='threshold_v' for block_size 1",
            )

    @property
    def compressing(self) -> bool:
        """False for the dense baseline: every element goes on the wire and nothing is kept back."""
        return self.density < 1.0

    @classmethod
    def dense_baseline(cls, **overrides: Any) -> ClientConfig:
        """What DDP would send: every element in fp32, no error feedback, no staleness."""
        values: dict[str, Any] = {
            "density": 1.0,
            "wire_dtype": "fp32",
            "error_feedback": False,
            "staleness": 0,
        }
        values.update(overrides)
        return cls(**values)

    def with_changes(self, **changes: Any) -> ClientConfig:
        """A validated copy with ``changes`` applied (used for scheduler-announced updates)."""
        return dataclasses.replace(self, **changes)
