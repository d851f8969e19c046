"""Which model the job trains, as far as this gateway knows: one signature, agreed between gateways.

Why the gateways care. Sites only exchange (layer id, block indices, values); a site whose trainers built a
different model would add garbage into every aggregate. The trainer client sends its model signature in its
handshake (:mod:`wanrt.client.link.signature`) and refuses to train when the gateway's Welcome carries a
different one (naming the first differing layer), so every gateway must hand out *the job's* signature: the
first one
seen in the job, propagated between gateways in their handshake ``info`` and in
:class:`~wanrt.protocol.peer.round_frames.
JobModel` messages.

"First" across sites that start at the same moment has no clock to go by, so the rule is deterministic
instead: a signature that is *established* (its gateway already took part in rounds with it) beats one that
is not, and between two of the same standing the one presented by the lexicographically smaller site wins.
Every gateway applies the same rule to the same offers, so they converge on one signature, and a site that
joins a running job can never replace the model the job is training. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from wanrt.errors import RemoteProtocolError

__all__ = ["MODEL_INFO_KEYS", "JobModelState", "ModelSignature", "Offer"]

#: The keys of the client's signature (wanrt.client.link.signature.INFO_KEYS), plus who presented it and
#: whether it is established; kept here so the gateway does not import the trainer client.
SIGNATURE_KEYS: Final = ("model", "n_layers", "group", "layers")
MODEL_INFO_KEYS: Final = (*SIGNATURE_KEYS, "model_site", "model_established")

Offer = Literal["adopted", "same", "kept", "replaced"]


@dataclass(frozen=True)
class ModelSignature:
    """The four signature entries of a handshake ``info`` map and the site whose trainer presented them."""

    model: bytes
    n_layers: int
    group: int
    layers: bytes
    site: str

    @classmethod
    def from_info(cls, info: Mapping[str, Any], *, site: str | None, peer: str) -> ModelSignature | None:
        """The signature in ``info`` (``None`` if it carries none); ``site`` defaults to ``model_site``.

        A partial or mistyped signature is the sender's fault (:class:`RemoteProtocolError`).
        """
        present = [k for k in SIGNATURE_KEYS if k in info]
        if not present:
            return None
        if len(present) != len(SIGNATURE_KEYS):
            raise RemoteProtocolError("incomplete model signature", peer=peer, value=sorted(present))
        model, n_layers, group, layers = (info[k] for k in SIGNATURE_KEYS)
        owner = site if site is not None else info.get("model_site")
        if not (
            isinstance(model, bytes)
            and isinstance(layers, bytes)
            and type(n_layers) is int
            and type(group) is int
            and n_layers >= 0
            and group >= 1
            and isinstance(owner, str)
        ):
            raise RemoteProtocolError("malformed model signature", peer=peer)
        return cls(model, n_layers, group, layers, owner)

    def info(self, *, established: bool) -> dict[str, Any]:
        """The entries for a Welcome/Hello ``info`` map (trainers read the first five)."""
        return {
            "model": self.model,
            "n_layers": self.n_layers,
            "group": self.group,
            "layers": self.layers,
            "model_site": self.site,
            "model_established": established,
        }

    def same_model(self, other: ModelSignature) -> bool:
        return (self.model, self.n_layers, self.group, self.layers) == (
            other.model,
            other.n_layers,
            other.group,
            other.layers,
        )


class JobModelState:
    """The signature this gateway hands to trainers and peers, with the adoption rule of the module doc."""

    def __init__(self) -> None:
        self.current: ModelSignature | None = None
        self.established = False
        #: (site, site) pairs seen training different models, for /status and logs
        self.conflicts: list[tuple[str, str]] = []

    def offer(self, sig: ModelSignature, *, established: bool) -> Offer:
        """Consider ``sig`` (from our trainer or a peer); returns what happened to it."""
        cur = self.current
        if cur is None:
            self.current, self.established = sig, established
            return "adopted"
        wins = _beats(established, sig.site, self.established, cur.site)
        if cur.same_model(sig):
            if wins:  # same model: keep the label every gateway converges on
                self.current, self.established = sig, established
            return "same"
        self.conflicts.append((cur.site, sig.site))
        if wins:
            self.current, self.established = sig, established
            return "replaced"
        return "kept"

    def establish(self) -> None:
        """This gateway took part in a round with the current signature: it can no longer be replaced."""
        if self.current is not None:
            self.established = True

    def info(self) -> dict[str, Any]:
        return {} if self.current is None else self.current.info(established=self.established)


def _beats(est_a: bool, site_a: str, est_b: bool, site_b: str) -> bool:
    """Whether signature a wins over b: established first, then the smaller presenting site."""
    if est_a != est_b:
        return est_a
    return site_a < site_b
