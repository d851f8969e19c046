"""h: how many payloads one WAN round carries *in series*, per gateway topology (issue 9; ours).

Why: StellaTrain's Eq. 6 ``r ≥ 1 − B/m · t_i`` prices the exchange as one payload over one link. A wanrt
round is several messages one after another, and the sparse aggregate grows on the way: the union of
``n`` top-k sets at a small density is nearly their sum. Measured in the full real-daemon overhead run
(3 sites, tree, density 0.004): each leaf sent 60.9 MB up over the run and the root sent 174.4 MB down to
each leaf, 2.86 times as much. The search sizes the payload with ``L + h · payload / B``; with h = 1 it
planned a round of ~100 ms against 85 ms of compute and called it hidden.

Per topology, for ``n`` sites and a payload ``p`` per site (upper bounds: sparse sets may overlap):

* ``star`` / ``tree``: a leaf's ``p`` goes up, the root's aggregate of up to ``n·p`` comes down —
  ``1 + n``. (A deeper tree forwards partial aggregates; its longest chain is bounded the same way by its
  subtree sizes, which ``1 + n`` covers for the two-level trees wanrt builds for a handful of sites.)
* ``ring``: reduce-scatter steps carry growing partial sums of a ``p/n`` segment (``k·p/n`` at step
  ``k``), all-gather steps finished segments (``n · p/n = p``): ``(n − 1)/2 + (n − 1)``.
* ``allpairs``: each member sends its ``p/n`` segment to the owner, the owners send finished segments of up
  to ``p`` back, every link at once: ``1/n + 1``.
* ``parent_child``: the ring among the core plus a child's payload up and the aggregate down; bounded by
  the ring's and the star's larger value.

One site exchanges nothing over the WAN: h = 1 (the paper's model, harmless).
"""

from __future__ import annotations

from wanrt.errors import ConfigError

__all__ = ["serial_payloads"]


def serial_payloads(topology: str, sites: int) -> float:
    """h for ``sites`` sites joined by a ``topology`` round (module docstring)."""
    if sites < 1:
        raise ConfigError("need at least one site", key="sites", value=sites)
    n = float(sites)
    if sites == 1:
        return 1.0
    if topology in ("star", "tree"):
        return 1.0 + n
    if topology == "ring":
        return (n - 1.0) / 2.0 + (n - 1.0)
    if topology == "allpairs":
        return 1.0 / n + 1.0
    if topology == "parent_child":
        return max(1.0 + n, (n - 1.0) / 2.0 + (n - 1.0))
    raise ConfigError(f"unknown topology {topology!r}", key="topology", value=topology)
