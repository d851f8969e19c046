"""Contribution-id sets (``(site, iteration)`` pairs) in a form that stays cheap at 1 000 sites.

Why this module. A round's result names every push it sums (:mod:`wanrt.protocol.peer.round_msg`), so in an
N-site tree the final result carries N ids and travels to all N gateways: every per-id step done at every
gateway — decoding, checking, set building, the trainer ledger, the statistics — is O(N) per gateway and
O(N²) per round. At 1 000 sites that was half the simulator's time (issue 8). The semantics stay the ones
of a sorted tuple of pairs (the engine's canonical form, compared with ``==``); what changes is the cost:

* :class:`ContribIds` *is* that sorted tuple (a subclass, so every reader of ``tuple[ContribId, ...]``
  keeps working), and remembers what was derived from it once: its wire form, its set of pairs, its
  distinct sites, the site set it was checked against. An id set is immutable, so a derived value never
  goes stale, and a result forwarded to eight children is encoded once, not eight times.
* On the wire an id set is one buffer, ``<iteration>=<site>,<site>,...;<iteration>=...`` (groups in
  increasing iteration, names sorted inside a group; site names cannot contain ``=,;``), instead of a
  msgpack map of 1 000 one-element lists: a few KiB decoded with ``bytes.split`` instead of 1 000
  Python-level entries. :func:`decode_ids` checks every bound before it allocates (the count of names
  from ``bytes.count``, the blob length), validates names, iterations and the canonical order, and
  returns a :class:`ContribIds`. Decoding is a pure function of the bytes, so equal blobs share one
  decoded value (a bounded per-process cache): the simulator's 1 000 gateways decode the same final once.

Sans-IO: plain data and functions.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Final

from wanrt.errors import LimitExceeded, LocalProtocolError
from wanrt.protocol.checks import check_names
from wanrt.protocol.limits import MAX_COUNTER, MAX_NAME_CHARS
from wanrt.protocol.peer.round_msg import ContribId

__all__ = [
    "MAX_IDS_BLOB_BYTES",
    "MAX_ROUND_IDS",
    "ContribIds",
    "as_ids",
    "count_older",
    "decode_ids",
    "distinct_sites",
    "encode_ids",
    "id_groups",
    "id_pairs",
    "intern_sites",
    "iterations_of",
    "merge_ids",
    "missing_members",
    "site_names",
]

#: Contribution ids in one message. The engine bounds them by sites x (max_lag + 1); 16384 covers 256 sites
#: at the default max_lag of 64, and 1 000 sites with a few late rounds each.
MAX_ROUND_IDS: Final = 16384

#: Longest wire form of an id set: every id a maximal name plus a separator, and one ``<iteration>=``
#: prefix (at most 20 digits) per id in the worst case. Checked before the blob is split.
MAX_IDS_BLOB_BYTES: Final = MAX_ROUND_IDS * (MAX_NAME_CHARS + 1 + 22)

#: Decoded id sets kept per process (equal blobs share one value); cleared when full.
_DECODED_MAX: Final = 512
_decoded: dict[bytes, ContribIds] = {}

#: Interned site sets (see :func:`intern_sites`); cleared when full.
_SITE_SETS_MAX: Final = 64
_site_sets: dict[frozenset[str], frozenset[str]] = {}


class ContribIds(tuple[ContribId, ...]):
    """A canonical (sorted, duplicate-free) tuple of contribution ids that caches what is derived from it.

    Build it from pairs already in canonical order (:func:`merge_ids`, :func:`decode_ids`, or one id);
    :func:`as_ids` wraps any canonical tuple. Equal to the plain tuple of the same pairs.
    """

    # tuple subclasses cannot have slots; the instance dict holds the cached derived values
    _wire: bytes
    _pairs: frozenset[ContribId]
    _sites: frozenset[str]
    _distinct: tuple[str, ...]
    _checked: frozenset[str] | None
    _top: int
    _missing: tuple[tuple[str, ...], tuple[str, ...]] | None
    _older: tuple[int, int]
    _groups: tuple[tuple[int, frozenset[str]], ...]

    def wire(self) -> bytes:
        """The wire form (see the module docstring), built once."""
        w = self.__dict__.get("_wire")
        if w is None:
            w = self._wire = _encode(self)
        return w

    def pairs(self) -> frozenset[ContribId]:
        p = self.__dict__.get("_pairs")
        if p is None:
            p = self._pairs = frozenset(self)
        return p

    def sites(self) -> frozenset[str]:
        s = self.__dict__.get("_sites")
        if s is None:
            s = self._sites = frozenset(site for site, _ in self)
        return s

    def distinct(self) -> tuple[str, ...]:
        d = self.__dict__.get("_distinct")
        if d is None:
            d = self._distinct = tuple(sorted(self.sites()))
        return d

    def groups(self) -> tuple[tuple[int, frozenset[str]], ...]:
        """The ids by iteration, oldest first: (iteration, its sites as an interned set)."""
        g = self.__dict__.get("_groups")
        if g is None:
            g = self._groups = id_groups(self)
        return g

    def top(self) -> int:
        """The newest iteration among the ids (-1 when empty)."""
        t = self.__dict__.get("_top")
        if t is None:
            t = self._top = max((it for _, it in self), default=-1)
        return t

    def older(self, iteration: int) -> int:
        """How many ids are from before ``iteration`` (remembered for the last iteration asked about)."""
        got = self.__dict__.get("_older")
        if got is None or got[0] != iteration:
            got = self._older = (iteration, sum(1 for _, it in self if it < iteration))
        return got[1]

    def checked_against(self, sites: frozenset[str]) -> bool:
        """Whether :func:`gateways.rounds.checks.check_message` already accepted these ids for exactly this
        (interned) site set: every site known, iterations >= 0, strictly increasing."""
        return self.__dict__.get("_checked") is sites

    def mark_checked(self, sites: frozenset[str]) -> None:
        self._checked = sites


def as_ids(ids: Sequence[ContribId]) -> ContribIds:
    """``ids`` (canonical order) as a :class:`ContribIds` (itself if it is one)."""
    return ids if type(ids) is ContribIds else ContribIds(ids)


def merge_ids(*groups: Sequence[ContribId]) -> ContribIds:
    """Sorted union of contribution ids (a canonical form, so equal sets compare equal as tuples)."""
    if len(groups) == 1:
        return as_ids(groups[0])
    out: set[ContribId] = set()
    for g in groups:
        out.update(g)
    return ContribIds(sorted(out))


def id_pairs(ids: Sequence[ContribId]) -> frozenset[ContribId]:
    return ids.pairs() if type(ids) is ContribIds else frozenset(ids)


def site_names(ids: Sequence[ContribId]) -> frozenset[str]:
    """The distinct sites among ``ids``."""
    return ids.sites() if type(ids) is ContribIds else frozenset(s for s, _ in ids)


def distinct_sites(ids: Sequence[ContribId]) -> tuple[str, ...]:
    """The distinct sites among ``ids``, sorted (what an Aggregate lists)."""
    return ids.distinct() if type(ids) is ContribIds else tuple(sorted({s for s, _ in ids}))


def iterations_of(ids: Sequence[ContribId], site: str) -> list[int]:
    """The iterations ``site`` contributed among ``ids`` (canonical order: a binary search, O(log N))."""
    out: list[int] = []
    i = bisect_left(ids, (site, -1))
    while i < len(ids) and ids[i][0] == site:
        out.append(ids[i][1])
        i += 1
    return out


def count_older(ids: Sequence[ContribId], iteration: int) -> int:
    """How many ids are from before ``iteration`` (contributions counted late)."""
    if type(ids) is ContribIds:
        return ids.older(iteration)
    return sum(1 for _, it in ids if it < iteration)


def missing_members(ids: Sequence[ContribId], members: tuple[str, ...]) -> tuple[str, ...]:
    """``members`` without a contribution in ``ids``; remembered for the last member tuple asked about
    (every gateway of a job asks with the same plan's members)."""
    if type(ids) is ContribIds:
        cached = ids.__dict__.get("_missing")
        if cached is not None and cached[0] is members:
            return cached[1]
    present = site_names(ids)
    out = tuple(s for s in members if s not in present)
    if type(ids) is ContribIds:
        ids._missing = (members, out)
    return out


def intern_sites(sites: Iterable[str]) -> frozenset[str]:
    """One shared frozenset per distinct site set, so "already checked against this set" is an identity
    test (the simulator's 1 000 engines all check the same results against equal sets), and a plan lookup
    keyed by the live set compares by identity (``timeline``: 1 000 equal sets, ~13 us per comparison)."""
    key = frozenset(sites)
    got = _site_sets.get(key)
    if got is None:
        if len(_site_sets) >= _SITE_SETS_MAX:
            _site_sets.clear()
        got = _site_sets[key] = key
    return got


def id_groups(ids: Iterable[ContribId]) -> tuple[tuple[int, frozenset[str]], ...]:
    """``ids`` by iteration, oldest first, each iteration's sites interned (:func:`intern_sites`)."""
    by: dict[int, list[str]] = {}
    for site, it in ids:
        by.setdefault(it, []).append(site)
    return tuple((it, intern_sites(names)) for it, names in sorted(by.items()))


# -- wire form --------------------------------------------------------------------------------------------


def _encode(ids: Sequence[ContribId]) -> bytes:
    groups: dict[int, list[str]] = {}
    for site, it in ids:
        groups.setdefault(it, []).append(site)  # canonical order: names come sorted within a group
    return ";".join(f"{it}={','.join(names)}" for it, names in sorted(groups.items())).encode()


def encode_ids(ids: Sequence[ContribId]) -> bytes:
    """The wire form of ``ids`` (canonical order)."""
    return ids.wire() if type(ids) is ContribIds else _encode(ids)


def decode_ids(blob: bytes | bytearray | memoryview) -> ContribIds:
    """The id set of a wire blob, checked (every bound before allocating; names; iterations in
    ``[0, MAX_COUNTER]``; canonical order). Raises :class:`LocalProtocolError` / :class:`LimitExceeded`
    (the receiving link turns them into the peer's fault)."""
    if len(blob) > MAX_IDS_BLOB_BYTES:
        raise LimitExceeded(
            "contribution-id blob too long",
            name="MAX_IDS_BLOB_BYTES",
            limit=MAX_IDS_BLOB_BYTES,
            value=len(blob),
        )
    key = bytes(blob)
    got = _decoded.get(key)
    if got is not None:
        return got
    ids = _decode(key)
    if len(_decoded) >= _DECODED_MAX:
        _decoded.clear()
    _decoded[key] = ids
    return ids


def _decode(blob: bytes) -> ContribIds:
    if not blob:
        return ContribIds()
    n = blob.count(b",") + blob.count(b";") + 1  # an upper bound of the ids, known before splitting
    if n > MAX_ROUND_IDS:
        raise LimitExceeded("too many contribution ids", name="MAX_ROUND_IDS", limit=MAX_ROUND_IDS, value=n)
    try:
        text = blob.decode("ascii")
    except UnicodeDecodeError:
        raise LocalProtocolError("contribution ids must be ASCII") from None
    out: list[ContribId] = []
    prev_it = -1
    for group in text.split(";"):
        head, eq, body = group.partition("=")
        if not eq or not head.isdigit() or len(head) > 20:
            raise LocalProtocolError("malformed contribution-id group", value=group[:64])
        it = int(head)
        if it > MAX_COUNTER or it <= prev_it:
            raise LocalProtocolError("contribution-id iterations must increase within bounds", value=it)
        prev_it = it
        names = check_names(body.split(","), "ids site")
        if list(names) != sorted(set(names)):
            raise LocalProtocolError("contribution-id sites must be sorted and distinct", value=body[:64])
        out.extend([(s, it) for s in names])
    if prev_it != out[0][1]:  # several groups: back to the canonical (site, iteration) order
        out.sort()
    return ContribIds(out)
