"""Trainer push acks of results made at this site, held until a peer holds the result too.

A result made here (this site finished the round) exists nowhere else until a peer has it: if this
gateway died then, the others would re-run the round without this site's push, and a trainer told
"counted" would never re-send it (the chaos soak lost a killed root's last pushes so). So the acks of the
pushes such a result counts wait until a peer acknowledged the frame that carried the result (its
sequence number); a result sent to nobody, or whose every receiver's link ended, releases them at once
(the trainer re-sends what was not acked when a gateway dies). Sans-IO: the node says what was sent and
acknowledged, and sends the acks this returns.
"""

from __future__ import annotations

__all__ = ["Acks", "HeldAcks"]

#: (iteration, layer) pairs of trainer pushes, acked together
Acks = tuple[tuple[int, int], ...]


class HeldAcks:
    """See the module docstring. Keys are rounds ``(iteration, layer)``."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, int], Acks] = {}
        #: peer -> (frame sequence number, round) of the results sent to it and not acknowledged yet
        self._sent: dict[str, list[tuple[int, tuple[int, int]]]] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def hold(self, key: tuple[int, int], acks: Acks) -> None:
        """The result of round ``key`` was made here: its push acks wait for a peer to have it."""
        self._held[key] = self._held.get(key, ()) + acks

    def holds(self, key: tuple[int, int]) -> bool:
        return key in self._held

    def sent(self, peer: str, seq: int, key: tuple[int, int]) -> None:
        """The result of round ``key`` went to ``peer`` in frame ``seq``."""
        self._sent.setdefault(peer, []).append((seq, key))

    def unsent(self) -> list[Acks]:
        """Release the acks of results that went to nobody: nobody to wait for."""
        waiting = {key for sent in self._sent.values() for _, key in sent}
        return [self._held.pop(key) for key in [k for k in self._held if k not in waiting]]

    def release(self, peer: str, seq: int | None) -> list[Acks]:
        """``peer`` acknowledged our frames up to ``seq`` (None: its link ended): the acks of the results
        it now has (or that only waited for it), in the order they were sent."""
        sent = self._sent.get(peer)
        if not sent:
            return []
        done = [key for s, key in sent if seq is None or s <= seq]
        rest = [] if seq is None else [(s, key) for s, key in sent if s > seq]
        if rest:
            self._sent[peer] = rest
        else:
            del self._sent[peer]
        waiting = {key for other in self._sent.values() for _, key in other}
        out: list[Acks] = []
        for key in done:
            acks = self._held.get(key)
            if acks is not None and (seq is not None or key not in waiting):
                del self._held[key]
                out.append(acks)
        return out
