"""Stateful Dynamic Data Sharding (AntDT §IV-C) as one sans-IO object: requests, reports and "time is t" in,
grants out.

Why shards instead of a fixed partition: a fast site simply asks for more shards and a slow one for fewer,
so the data follows the throughput each site actually delivers (§IV-C2) without a balancing protocol.

Why states (§IV-C3): each shard of an epoch is TODO (ready), DOING (leased to one ``(site, rank)``) or DONE
(its gradients were pushed). A DOING shard goes back to TODO, at the end of the queue, when its holder
disconnects, starts afresh (``fresh`` request) or stays silent past ``lease_s``; so every shard is DONE at
least once (at-least-once, as the paper argues is the right trade-off). A shard DONE after being handed out
more than once counts in ``shards_repeated``: the price of that guarantee, measured.

Everything is bounded: ``max_shards`` records per epoch, ``max_outstanding`` shards per rank, holders only
while they hold something. :meth:`snapshot` / :meth:`restore` carry the state across a scheduler restart;
DOING shards come back as TODO, and their former holder may still report them DONE.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, TypeAlias

import numpy as np

from scheduler.sharding.config import ShardingConfig
from wanrt.errors import ConfigError

__all__ = ["SNAPSHOT_VERSION", "Grant", "Holder", "ShardService", "ShardStats"]

Holder: TypeAlias = tuple[str, int]  # (site, rank)
ShardRange: TypeAlias = tuple[int, int, int]  # (shard id, first sample, end sample)

TODO: Final = 0
DOING: Final = 1
DONE: Final = 2
_CHARS: Final = "TDX"  # state letters in a snapshot
_TO_CHARS: Final = bytes.maketrans(bytes([TODO, DOING, DONE]), _CHARS.encode())
_FROM_CHARS: Final = bytes.maketrans(_CHARS.encode(), bytes([TODO, TODO, DONE]))  # DOING comes back TODO
_ORDER_STREAM: Final = 0x5348  # keeps the shard order's random stream apart from other uses of the seed
SNAPSHOT_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Grant:
    """What a request gets: a status of :data:`wanrt.protocol.messages.SHARD_STATUSES` and, if
    ``granted``, shards of ``epoch``."""

    status: str
    epoch: int
    shards: tuple[ShardRange, ...] = ()


@dataclass(slots=True)
class ShardStats:
    granted: int = 0  # shards handed out (a re-grant counts again)
    done: int = 0  # shards that became DONE
    repeated: int = 0  # of those, handed out more than once before (computed at least twice)
    released: int = 0  # DOING shards sent back to TODO because their holder left or restarted
    expired: int = 0  # ... because their holder's lease ran out
    refused: int = 0  # DONE reports for shards the reporter did not hold
    stale: int = 0  # reports about another epoch or a shard id outside it
    duplicate: int = 0  # DONE reports for shards already DONE
    epochs_completed: int = 0


@dataclass(slots=True)
class _HolderState:
    shards: set[int] = field(default_factory=set)
    seen: float = 0.0


class ShardService:
    """See the module docstring. ``dataset_len`` is fixed by the first request (every trainer of a job
    shards the same dataset); a request naming another length is refused."""

    def __init__(self, cfg: ShardingConfig) -> None:
        self.cfg = cfg
        self.dataset_len: int | None = None
        self.n_shards = 0
        self.epoch = 0
        self.stats = ShardStats()
        self.dirty = False  # changed since the last snapshot
        self._state = bytearray()
        self._grants = bytearray()  # times handed out this epoch, saturating at 255
        self._holder: dict[int, Holder] = {}  # DOING shard -> holder
        self._former: dict[int, Holder] = {}  # TODO shard -> who held it last (may still report it)
        self._holders: dict[Holder, _HolderState] = {}
        self._queue: deque[int] = deque()
        self._queued = bytearray()
        self._done_count = 0

    # -- the shards of an epoch ------------------------------------------------------------------------

    def shard_range(self, sid: int) -> ShardRange:
        assert self.dataset_len is not None
        start = sid * self.cfg.shard_size
        return sid, start, min(start + self.cfg.shard_size, self.dataset_len)

    def order(self, epoch: int) -> list[int]:
        """The order shards of ``epoch`` are handed out: a permutation drawn from (seed, epoch), so that
        data order is reproducible across runs and restarts (§IV-C1's shard shuffler, between shards)."""
        rng = np.random.default_rng([self.cfg.seed, epoch, _ORDER_STREAM])
        return [int(x) for x in rng.permutation(self.n_shards)]

    def _size(self, dataset_len: int) -> int | None:
        k = math.ceil(dataset_len / self.cfg.shard_size)
        return k if 1 <= k <= self.cfg.max_shards else None

    def _start_epoch(self, epoch: int, queue: Iterable[int] | None = None) -> None:
        k = self.n_shards
        self.epoch = epoch
        self._state = bytearray(k)
        self._grants = bytearray(k)
        self._holder.clear()
        self._former.clear()
        self._holders.clear()
        self._queue = deque(self.order(epoch) if queue is None else queue)
        self._queued = bytearray(k)
        for sid in self._queue:
            self._queued[sid] = 1
        self._done_count = 0
        self.dirty = True

    @property
    def complete(self) -> bool:
        """Every shard of the current epoch is DONE."""
        return self.dataset_len is not None and self._done_count == self.n_shards

    def _over(self, epoch: int) -> bool:
        return self.cfg.epochs > 0 and epoch >= self.cfg.epochs

    # -- requests --------------------------------------------------------------------------------------

    def request(
        self,
        site: str,
        rank: int,
        *,
        epoch: int,
        dataset_len: int,
        want: int,
        fresh: bool,
        now: float,
    ) -> Grant:
        """Lease up to ``want`` TODO shards of ``epoch`` to ``(site, rank)`` (capped by ``max_outstanding``
        minus what it holds). ``fresh``: it holds nothing any more (a restarted rank).

        A request for a later epoch than the current, unfinished one gets the current epoch's leftovers
        (shards re-queued from a lost rank after everybody else moved on), else ``wait``; the next epoch
        starts once every shard of the current one is DONE. ``drained``: this epoch has nothing left to
        hand out, the rest is in flight (the asker's pass over the epoch is over)."""
        if not self.cfg.enabled:
            return Grant("unavailable", epoch)
        if self.dataset_len is None:
            k = self._size(dataset_len)
            if k is None or dataset_len < 1:
                return Grant("refused", epoch)
            self.dataset_len, self.n_shards = dataset_len, k
            self._start_epoch(epoch)
        elif dataset_len != self.dataset_len:
            return Grant("refused", epoch)
        holder = (site, rank)
        if fresh:
            self._release_holder(holder, expired=False)
        if epoch < self.epoch:
            return Grant("finished", epoch)
        if epoch > self.epoch:
            if not self.complete:  # leftovers of the current epoch first: re-queued shards of a lost rank
                out, _ = self._hand_out(holder, want, now)
                return Grant("granted", self.epoch, out) if out else Grant("wait", epoch)
            if self._over(epoch):
                return Grant("finished", epoch)
            self._start_epoch(epoch)
        if self.complete or self._over(epoch):
            return Grant("finished", epoch)
        out, room = self._hand_out(holder, want, now)
        if out:
            return Grant("granted", epoch, out)
        # no room: this rank holds enough, it must finish some first; else the rest is in flight
        return Grant("wait" if room <= 0 else "drained", epoch)

    def _hand_out(self, holder: Holder, want: int, now: float) -> tuple[tuple[ShardRange, ...], int]:
        """Up to ``want`` TODO shards, capped by ``max_outstanding``; returns them and the room there was."""
        h = self._holders.get(holder)
        held = 0 if h is None else len(h.shards)
        room = min(want, self.cfg.max_outstanding - held)
        out: list[ShardRange] = []
        while len(out) < room and self._queue:
            sid = self._queue.popleft()
            self._queued[sid] = 0
            if self._state[sid] != TODO:
                continue  # completed by its former holder while queued
            self._lease(sid, holder, now)
            out.append(self.shard_range(sid))
        if h is not None:
            h.seen = now
        if out:
            self.dirty = True
        return tuple(out), room

    def _lease(self, sid: int, holder: Holder, now: float) -> None:
        self._state[sid] = DOING
        self._holder[sid] = holder
        self._former.pop(sid, None)
        if self._grants[sid] < 255:
            self._grants[sid] += 1
        h = self._holders.get(holder)
        if h is None:
            h = self._holders[holder] = _HolderState()
        h.shards.add(sid)
        h.seen = now
        self.stats.granted += 1

    # -- reports ---------------------------------------------------------------------------------------

    def done(self, site: str, rank: int, epoch: int, shards: Iterable[int], now: float) -> int:
        """``(site, rank)`` finished these shards. Only its own are taken: DOING and leased to it, or back in
        TODO with it as the last holder (its lease ran out or the scheduler restarted meanwhile). Returns
        how many became DONE."""
        holder = (site, rank)
        h = self._holders.get(holder)
        if h is not None:
            h.seen = now
        accepted = 0
        for sid in shards:
            if self.dataset_len is None or epoch != self.epoch or not 0 <= sid < self.n_shards:
                self.stats.stale += 1
                continue
            st = self._state[sid]
            if st == DONE:
                self.stats.duplicate += 1
            elif st == DOING and self._holder[sid] == holder:
                del self._holder[sid]
                assert h is not None
                h.shards.discard(sid)
                self._finish(sid)
                accepted += 1
            elif st == TODO and self._former.get(sid) == holder:
                del self._former[sid]
                self._finish(sid)  # left in the queue: skipped when popped
                accepted += 1
            else:
                self.stats.refused += 1
        if h is not None and not h.shards:
            del self._holders[holder]
        return accepted

    def _finish(self, sid: int) -> None:
        self._state[sid] = DONE
        self._done_count += 1
        self.stats.done += 1
        if self._grants[sid] > 1:
            self.stats.repeated += 1
        if self._done_count == self.n_shards:
            self.stats.epochs_completed += 1
        self.dirty = True

    # -- holders leaving -------------------------------------------------------------------------------

    def release(self, site: str, rank: int | None = None) -> int:
        """``site``'s trainer left (``rank`` None: all its ranks): their DOING shards go back to TODO, at the
        end of the queue (§IV-C3). Returns how many."""
        holders = [h for h in self._holders if h[0] == site and (rank is None or h[1] == rank)]
        return sum(self._release_holder(h, expired=False) for h in holders)

    def _release_holder(self, holder: Holder, *, expired: bool) -> int:
        h = self._holders.pop(holder, None)
        if h is None:
            return 0
        for sid in sorted(h.shards):
            del self._holder[sid]
            self._state[sid] = TODO
            self._former[sid] = holder
            if not self._queued[sid]:
                self._queue.append(sid)
                self._queued[sid] = 1
        n = len(h.shards)
        if expired:
            self.stats.expired += n
        else:
            self.stats.released += n
        self.dirty = True
        return n

    def expire(self, now: float) -> int:
        """Holders silent for ``lease_s``: their shards go back to TODO."""
        due = [hk for hk, h in self._holders.items() if now >= h.seen + self.cfg.lease_s]
        return sum(self._release_holder(hk, expired=True) for hk in due)

    def next_deadline(self) -> float | None:
        if not self._holders:
            return None
        return min(h.seen for h in self._holders.values()) + self.cfg.lease_s

    # -- views -----------------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        todo = self._state.count(TODO)
        doing = self._state.count(DOING)
        return {"todo": todo, "doing": doing, "done": self.n_shards - todo - doing}

    def lost(self) -> int:
        """Shards of the current epoch that no path leads to DONE any more: not DONE, not leased, not
        queued. The service's invariant is that this is 0; it is computed, not assumed."""
        return sum(
            1
            for sid in range(self.n_shards)
            if self._state[sid] != DONE
            and not (self._state[sid] == DOING and sid in self._holder)
            and not (self._state[sid] == TODO and self._queued[sid])
        )

    def held_by(self, site: str, rank: int) -> set[int]:
        h = self._holders.get((site, rank))
        return set() if h is None else set(h.shards)

    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.cfg.enabled,
            "dataset_len": self.dataset_len,
            "shards": self.n_shards,
            "epoch": self.epoch,
            "complete": self.complete,
            **self.counts(),
            "holders": len(self._holders),
            "stats": asdict(self.stats),
        }

    # -- snapshot --------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready picture of the state. DOING shards are listed with their holder; on restore they
        are TODO again (their holders may have gone with the old scheduler) but the holder may report them."""
        self.dirty = False
        grants = np.frombuffer(bytes(self._grants), np.uint8)
        states = np.frombuffer(bytes(self._state), np.uint8)
        ids = np.flatnonzero((grants > 0) & (states != DONE))
        return {
            "version": SNAPSHOT_VERSION,
            "shard_size": self.cfg.shard_size,
            "seed": self.cfg.seed,
            "dataset_len": self.dataset_len,
            "epoch": self.epoch,
            "states": bytes(self._state).translate(_TO_CHARS).decode("ascii"),
            "doing": [[sid, h[0], h[1]] for sid, h in sorted(self._holder.items())],
            "former": [[sid, h[0], h[1]] for sid, h in sorted(self._former.items())],
            "grants": dict(zip(map(str, ids.tolist()), grants[ids].tolist(), strict=True)),
            "stats": asdict(self.stats),
        }

    @classmethod
    def restore(cls, cfg: ShardingConfig, data: Mapping[str, Any]) -> ShardService:
        """Rebuild from :meth:`snapshot`; a snapshot of other shards (another ``shard_size`` or ``seed``) or
        a damaged one is a :class:`ConfigError` naming ``state_file``, never silently ignored."""
        key = "scheduler.sharding.state_file"

        def bad(why: str) -> ConfigError:
            return ConfigError(f"shard state file {cfg.state_file}: {why}", key=key, value=cfg.state_file)

        svc = cls(cfg)
        try:
            if data.get("version") != SNAPSHOT_VERSION:
                raise bad(f"unknown version {data.get('version')!r}")
            if data["shard_size"] != cfg.shard_size or data["seed"] != cfg.seed:
                raise bad(
                    f"written with shard_size={data['shard_size']} seed={data['seed']}, the config says "
                    f"shard_size={cfg.shard_size} seed={cfg.seed}; remove the file to start over"
                )
            n = data["dataset_len"]
            stats = ShardStats(**{k: int(v) for k, v in data["stats"].items()})
            if n is None:
                svc.stats = stats
                return svc
            k = svc._size(int(n))
            states = data["states"]
            if k is None or not isinstance(states, str) or len(states) != k:
                raise bad("its shard table does not match its dataset size")
            if states.strip(_CHARS):
                raise bad("its shard table holds unknown states")
            svc.dataset_len, svc.n_shards = int(n), k
            doing = {int(sid): (str(site), int(rank)) for sid, site, rank in data["doing"]}
            former = {int(sid): (str(site), int(rank)) for sid, site, rank in data["former"]}
            if not all(0 <= sid < k for sid in (*doing, *former)):
                raise bad("it names shards outside its dataset")
            table = bytearray(states.encode("ascii").translate(_FROM_CHARS))
            epoch = int(data["epoch"])
            svc.n_shards = k
            queue = [sid for sid in svc.order(epoch) if table[sid] == TODO and sid not in doing]
            svc._start_epoch(epoch, queue)
            svc._state = table
            for sid, g in data["grants"].items():
                svc._grants[int(sid)] = min(int(g), 255)
            svc._former.update(former)
            svc._former.update(doing)
            for sid in sorted(doing):  # back to TODO, at the end of the queue
                if not svc._queued[sid]:
                    svc._queue.append(sid)
                    svc._queued[sid] = 1
            svc._done_count = svc._state.count(DONE)
            stats.released += len(doing)
            svc.stats = stats
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, UnicodeError) as exc:
            raise bad(f"damaged ({type(exc).__name__}: {exc})") from None
        if svc.lost():  # a TODO shard the file forgot to queue: queue it rather than lose it
            for sid in range(svc.n_shards):
                if svc._state[sid] == TODO and not svc._queued[sid]:
                    svc._queue.append(sid)
                    svc._queued[sid] = 1
        svc.dirty = False
        return svc
