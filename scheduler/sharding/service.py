"""Stateful Dynamic Data Sharding (AntDT §IV-C) as one sans-IO object: requests, reports and "time is t" in,
grants out.

Why shards instead of a fixed partition: a fast site simply asks for more shards and a slow one for fewer,
so the data follows the throughput each site actually delivers (§IV-C2) without a balancing protocol.

Why states (§IV-C3): each shard of an epoch is TODO (ready), DOING (leased to one ``(site, rank)``) or DONE
(its gradients were pushed). A DOING shard goes back to TODO, at the end of its epoch's queue, when its
holder disconnects, starts afresh (``fresh`` request) or stays silent past ``lease_s``; so every shard is
DONE at least once (at-least-once, as the paper argues is the right trade-off). A shard DONE after being
handed out more than once counts in ``shards_repeated``: the price of that guarantee, measured.

Why two epochs may be open at once: wanrt's sites step together, iteration by iteration, so a site that
finds no TODO shard left in epoch e must be able to go on with epoch e+1 while other sites still train e's
last shards; waiting for them would stall the whole job (they wait for its gradients). So epoch e+1 opens
as soon as e has no TODO shard left, and e stays open until its last shard is DONE. A shard of e that comes
back (its holder died) is handed out before any shard of e+1. A third epoch waits until the oldest is DONE,
which bounds the state to two epochs' tables.

Everything is bounded: two tables of ``max_shards`` records, ``max_outstanding`` shards per rank, holders
only while they hold something. :meth:`snapshot` / :meth:`restore` carry the state across a scheduler
restart; DOING shards come back as TODO, and their former holder may still report them DONE.
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
Lease: TypeAlias = tuple[int, int]  # (epoch, shard id)

TODO: Final = 0
DOING: Final = 1
DONE: Final = 2
_CHARS: Final = "TDX"  # state letters in a snapshot
_TO_CHARS: Final = bytes.maketrans(bytes([TODO, DOING, DONE]), _CHARS.encode())
_FROM_CHARS: Final = bytes.maketrans(_CHARS.encode(), bytes([TODO, TODO, DONE]))  # DOING comes back TODO
_ORDER_STREAM: Final = 0x5348  # keeps the shard order's random stream apart from other uses of the seed
SNAPSHOT_VERSION: Final = 2
#: epochs open at once (see the module docstring)
MAX_OPEN_EPOCHS: Final = 2


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
    stale: int = 0  # reports about an epoch that is not open or a shard id outside it
    duplicate: int = 0  # DONE reports for shards already DONE
    epochs_completed: int = 0


@dataclass(slots=True)
class _HolderState:
    shards: set[Lease] = field(default_factory=set)
    seen: float = 0.0


class _Epoch:
    """One epoch's shard table: a state and a grant count per shard, holders, and the TODO queue."""

    def __init__(self, k: int, queue: Iterable[int]) -> None:
        self.state = bytearray(k)
        self.grants = bytearray(k)  # times handed out, saturating at 255
        self.holder: dict[int, Holder] = {}  # DOING shard -> holder
        self.former: dict[int, Holder] = {}  # TODO shard -> who held it last (may still report it)
        self.queue: deque[int] = deque(queue)
        self.queued = bytearray(k)
        for sid in self.queue:
            self.queued[sid] = 1
        self.done = 0

    @property
    def complete(self) -> bool:
        return self.done == len(self.state)

    def pop_todo(self) -> int | None:
        while self.queue:
            sid = self.queue.popleft()
            self.queued[sid] = 0
            if self.state[sid] == TODO:
                return sid
            # else: completed by its former holder while queued
        return None

    def has_todo(self) -> bool:
        while self.queue and self.state[self.queue[0]] != TODO:
            self.queued[self.queue.popleft()] = 0
        return bool(self.queue)

    def requeue(self, sid: int) -> None:
        if not self.queued[sid]:
            self.queue.append(sid)
            self.queued[sid] = 1

    def lost(self) -> int:
        return sum(
            1
            for sid in range(len(self.state))
            if self.state[sid] != DONE
            and not (self.state[sid] == DOING and sid in self.holder)
            and not (self.state[sid] == TODO and self.queued[sid])
        )


class ShardService:
    """See the module docstring. ``dataset_len`` is fixed by the first request (every trainer of a job
    shards the same dataset); a request naming another length is refused."""

    def __init__(self, cfg: ShardingConfig) -> None:
        self.cfg = cfg
        self.dataset_len: int | None = None
        self.n_shards = 0
        self.stats = ShardStats()
        self.dirty = False  # changed since the last snapshot
        self._epochs: dict[int, _Epoch] = {}  # open epochs, at most MAX_OPEN_EPOCHS
        self._holders: dict[Holder, _HolderState] = {}

    # -- the shards of an epoch ------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The newest open epoch."""
        return max(self._epochs, default=0)

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

    def _open(self, epoch: int) -> _Epoch:
        for old in [e for e, t in self._epochs.items() if t.complete]:
            del self._epochs[old]  # a DONE epoch closes when a newer one opens
        t = self._epochs[epoch] = _Epoch(self.n_shards, self.order(epoch))
        self.dirty = True
        return t

    @property
    def complete(self) -> bool:
        """Every shard of every open epoch is DONE."""
        return bool(self._epochs) and all(t.complete for t in self._epochs.values())

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
        """Lease up to ``want`` TODO shards to ``(site, rank)``, which trains ``epoch`` (capped by
        ``max_outstanding`` minus what it holds). ``fresh``: it holds nothing any more (a restarted rank).

        Shards of an older open epoch come first (leftovers of a lost rank), then shards of ``epoch``; a
        rank asking past the newest epoch opens the next one once the newest has no TODO shard left.
        Statuses: ``granted`` (with the shards' epoch), ``drained`` (``epoch`` has nothing left to hand
        out: the rank's pass over it is over), ``finished`` (``epoch`` is DONE, or past the configured
        epochs and everything is DONE), ``wait`` (this rank holds its share, or the next epoch cannot open
        yet: ask again)."""
        if not self.cfg.enabled:
            return Grant("unavailable", epoch)
        if self.dataset_len is None:
            k = self._size(dataset_len)
            if k is None or dataset_len < 1:
                return Grant("refused", epoch)
            self.dataset_len, self.n_shards = dataset_len, k
        elif dataset_len != self.dataset_len:
            return Grant("refused", epoch)
        holder = (site, rank)
        if fresh:
            self._release_holder(holder, expired=False)
        h = self._holders.get(holder)
        if h is not None:
            h.seen = now
        room = min(want, self.cfg.max_outstanding - (0 if h is None else len(h.shards)))
        if not self._epochs:
            if self._over(epoch):
                return Grant("finished", epoch)
            self._open(epoch)
        if epoch < min(self._epochs):
            return Grant("finished", epoch)
        # open epochs this rank may take shards from, oldest first
        for e in sorted(self._epochs):
            if e > epoch:
                break
            t = self._epochs[e]
            if room > 0 and t.has_todo():
                return self._hand_out(e, t, holder, room, now)
        newest = max(self._epochs)
        if epoch <= newest:
            mine = self._epochs.get(epoch)
            if mine is None or mine.complete:
                return Grant("finished", epoch)
            return Grant("wait" if room <= 0 else "drained", epoch)
        # past the newest epoch: its TODO shards first, else open the next one (never skipping an epoch)
        latest = self._epochs[newest]
        if room <= 0:
            return Grant("wait", epoch)
        if latest.has_todo():
            return self._hand_out(newest, latest, holder, room, now)
        if self._over(newest + 1):
            return Grant("finished" if self.complete else "wait", epoch)
        if sum(1 for x in self._epochs.values() if not x.complete) >= MAX_OPEN_EPOCHS:
            return Grant("wait", epoch)  # the oldest epoch still has shards in flight
        return self._hand_out(newest + 1, self._open(newest + 1), holder, room, now)

    def _hand_out(self, epoch: int, t: _Epoch, holder: Holder, room: int, now: float) -> Grant:
        out: list[ShardRange] = []
        while len(out) < room:
            sid = t.pop_todo()
            if sid is None:
                break
            t.state[sid] = DOING
            t.holder[sid] = holder
            t.former.pop(sid, None)
            if t.grants[sid] < 255:
                t.grants[sid] += 1
            h = self._holders.get(holder)
            if h is None:
                h = self._holders[holder] = _HolderState()
            h.shards.add((epoch, sid))
            h.seen = now
            self.stats.granted += 1
            out.append(self.shard_range(sid))
        self.dirty = True
        return Grant("granted", epoch, tuple(out))

    # -- reports ---------------------------------------------------------------------------------------

    def done(self, site: str, rank: int, epoch: int, shards: Iterable[int], now: float) -> int:
        """``(site, rank)`` finished these shards of ``epoch``. Only its own are taken: DOING and leased to
        it, or back in TODO with it as the last holder (its lease ran out or the scheduler restarted
        meanwhile). Returns how many became DONE."""
        holder = (site, rank)
        h = self._holders.get(holder)
        if h is not None:
            h.seen = now
        t = self._epochs.get(epoch)
        accepted = 0
        for sid in shards:
            if t is None or not 0 <= sid < self.n_shards:
                self.stats.stale += 1
                continue
            st = t.state[sid]
            if st == DONE:
                self.stats.duplicate += 1
            elif st == DOING and t.holder[sid] == holder:
                del t.holder[sid]
                assert h is not None
                h.shards.discard((epoch, sid))
                self._finish(t, sid)
                accepted += 1
            elif st == TODO and t.former.get(sid) == holder:
                del t.former[sid]
                self._finish(t, sid)  # left in the queue: skipped when popped
                accepted += 1
            else:
                self.stats.refused += 1
        if h is not None and not h.shards:
            del self._holders[holder]
        return accepted

    def _finish(self, t: _Epoch, sid: int) -> None:
        t.state[sid] = DONE
        t.done += 1
        self.stats.done += 1
        if t.grants[sid] > 1:
            self.stats.repeated += 1
        if t.complete:
            self.stats.epochs_completed += 1
            if len(self._epochs) > 1 and t is not self._epochs[max(self._epochs)]:
                del self._epochs[min(e for e, x in self._epochs.items() if x is t)]
        self.dirty = True

    # -- holders leaving -------------------------------------------------------------------------------

    def release(self, site: str, rank: int | None = None) -> int:
        """``site``'s trainer left (``rank`` None: all its ranks): their DOING shards go back to TODO, at the
        end of their epoch's queue (§IV-C3). Returns how many."""
        holders = [h for h in self._holders if h[0] == site and (rank is None or h[1] == rank)]
        return sum(self._release_holder(h, expired=False) for h in holders)

    def _release_holder(self, holder: Holder, *, expired: bool) -> int:
        h = self._holders.pop(holder, None)
        if h is None:
            return 0
        for epoch, sid in sorted(h.shards):
            t = self._epochs[epoch]
            del t.holder[sid]
            t.state[sid] = TODO
            t.former[sid] = holder
            t.requeue(sid)
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
        """Shards of the open epochs by state."""
        todo = sum(t.state.count(TODO) for t in self._epochs.values())
        doing = sum(t.state.count(DOING) for t in self._epochs.values())
        total = self.n_shards * len(self._epochs)
        return {"todo": todo, "doing": doing, "done": total - todo - doing}

    def lost(self) -> int:
        """Shards of the open epochs that no path leads to DONE any more: not DONE, not leased, not queued.
        The service's invariant is that this is 0; it is computed, not assumed."""
        return sum(t.lost() for t in self._epochs.values())

    def open_epochs(self) -> list[int]:
        return sorted(self._epochs)

    def state_of(self, epoch: int, sid: int) -> int | None:
        t = self._epochs.get(epoch)
        return None if t is None else t.state[sid]

    def held_by(self, site: str, rank: int) -> set[int]:
        h = self._holders.get((site, rank))
        return set() if h is None else {sid for _, sid in h.shards}

    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.cfg.enabled,
            "dataset_len": self.dataset_len,
            "shards": self.n_shards,
            "epoch": self.epoch,
            "open_epochs": self.open_epochs(),
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
        tables = []
        for e, t in sorted(self._epochs.items()):
            grants = np.frombuffer(bytes(t.grants), np.uint8)
            states = np.frombuffer(bytes(t.state), np.uint8)
            ids = np.flatnonzero((grants > 0) & (states != DONE))
            tables.append(
                {
                    "epoch": e,
                    "states": bytes(t.state).translate(_TO_CHARS).decode("ascii"),
                    "doing": [[sid, h[0], h[1]] for sid, h in sorted(t.holder.items())],
                    "former": [[sid, h[0], h[1]] for sid, h in sorted(t.former.items())],
                    "grants": dict(zip(map(str, ids.tolist()), grants[ids].tolist(), strict=True)),
                }
            )
        return {
            "version": SNAPSHOT_VERSION,
            "shard_size": self.cfg.shard_size,
            "seed": self.cfg.seed,
            "dataset_len": self.dataset_len,
            "epochs": tables,
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
            svc.stats = stats
            if n is None:
                return svc
            k = svc._size(int(n))
            if k is None:
                raise bad("its dataset size does not fit max_shards")
            svc.dataset_len, svc.n_shards = int(n), k
            tables = data["epochs"]
            if not isinstance(tables, list) or len(tables) > MAX_OPEN_EPOCHS:
                raise bad("it lists more open epochs than the service keeps")
            for tab in tables:
                states = tab["states"]
                if not isinstance(states, str) or len(states) != k:
                    raise bad("its shard table does not match its dataset size")
                if states.strip(_CHARS):
                    raise bad("its shard table holds unknown states")
                doing = {int(sid): (str(site), int(rank)) for sid, site, rank in tab["doing"]}
                former = {int(sid): (str(site), int(rank)) for sid, site, rank in tab["former"]}
                if not all(0 <= sid < k for sid in (*doing, *former)):
                    raise bad("it names shards outside its dataset")
                epoch = int(tab["epoch"])
                table = bytearray(states.encode("ascii").translate(_FROM_CHARS))
                queue = [sid for sid in svc.order(epoch) if table[sid] == TODO and sid not in doing]
                t = svc._epochs[epoch] = _Epoch(k, queue)
                t.state = table
                for sid, g in tab["grants"].items():
                    t.grants[int(sid)] = min(int(g), 255)
                t.former.update(former)
                t.former.update(doing)
                for sid in sorted(doing):  # back to TODO, at the end of the queue
                    t.requeue(sid)
                t.done = t.state.count(DONE)
                stats.released += len(doing)
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, UnicodeError) as exc:
            raise bad(f"damaged ({type(exc).__name__}: {exc})") from None
        for t in svc._epochs.values():  # a TODO shard the file forgot to queue: queue it rather than lose it
            for sid in range(k):
                if t.state[sid] == TODO:
                    t.requeue(sid)
        svc.dirty = False
        return svc
