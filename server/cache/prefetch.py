"""Prefetch (issue 58, item 3): a waiting session's KV brought back to the device before it calls again.

The predictive policy's lifecycle model (server/cache/lifecycle_model.py) values each waiting session
by the discounted chance that its next call comes in each of the next steps (a session whose tool is
about to return, or is overdue, is worth most). A session worth at least `min_value` (the simulator's
rule: bench/cachesim/prefetch.py) whose last path host RAM (H) or disk (D) holds further than the
device does has the rest restored into a resident owner (tier S), so its next request attaches it
(`seq_cp`, no copy) instead of restoring it on admission. Without prefetch the same KV is restored
when the request is admitted, on its critical path.

Contracts:
- Engine thread only (`step`, `arrived`, `ended`); `stats` reads counters.
- One job at a time. While requests run a job restores at most `step_bytes` per engine step (a piece
  of whole tokens), all of it when the engine is idle: the longest stall it causes is one piece's
  restore (`max_piece_ms`), never a whole prefix's. Where restores are staged (`joiner` given, and
  KVOps.stages: paged attention on the CPU) a job's part held in host RAM is instead joined on the join
  thread, its cells taken on the engine thread and its K and V written beside the compute
  (server/cache/restore.py, "staged"); the engine thread's part is the cells taken (`max_stage_ms`).
- D's part is read on the disk tier's read thread, started by the prediction, not by an admission;
  the job restores it once read.
- Room: only owners worth less than the session are evicted for it (each written back as any evicted
  owner is, so nothing is lost, only moved down a tier); a job that cannot get room is not started.
- A request of the session that arrives while its job runs finishes the job's host part first (its own
  restore, which it would have made anyway: a staged part's join and write waited for) and takes what is
  done; a disk read still in flight is dropped. It never waits for another session's job.
- Everything a job took is given back on every path: on a failure the owner sequence is cleared and
  its id returned; the request computes or restores as without prefetch.
- Counted: jobs, tokens prefetched, hits (prefetched tokens a request then attached), misses
  (prefetched owners evicted before any use), late (a request arrived before its job ended), failed.
"""

from __future__ import annotations

import logging
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from server.cache.kv_format import KVSegment
from server.cache.kv_ops import KVOps
from server.cache.lifecycle_counts import WAITING
from server.cache.predictive_policy import PredictivePolicy
from server.cache.radix_tree import RadixTree
from server.cache.resident import ResidentOwners
from server.cache.restore_pieces import next_piece, restore_pieces
from server.cache.slot_paths import slot_paths
from server.cache.tiers import KVTier, Source, tier_of
from server.engine.llama_runtime import LlamaRuntime
from server.engine.seq_ids import SequenceIdPool, SequenceIdsExhausted
from server.engine.sequence import Sequence
from server.engine.slots import SlotPool, common_prefix_len

log = logging.getLogger(__name__)

MAX_SESSIONS = 1024  # waiting sessions whose last path is remembered


@dataclass
class _Job:
    session: str
    tokens: list[int]  # the path being brought up: tokens[:end]
    sid: int  # the owner sequence it is restored into
    first: int  # positions [0, first) were on the device already (attached, not restored)
    done: int  # positions [0, done) are in sid's cells
    end: int
    pending: deque[KVSegment] = field(default_factory=deque)  # H's part, in order
    disk: Future | None = None  # D's part, being read
    disk_start: int = 0
    staged: Future | None = None  # staged: the join (JoinedState) and then the write (KVOps.stage) in flight
    staged_end: int = 0  # where the staged part ends
    writing: bool = False  # `staged` is the write


class Prefetcher:
    def __init__(self, *, policy: PredictivePolicy, runtime: LlamaRuntime, kv: KVOps, seq_ids: SequenceIdPool,
                 tree: RadixTree, tiers: tuple[KVTier, ...], resident: ResidentOwners, slots: SlotPool,
                 running: Callable[[], list[Sequence]], disk_reader: ThreadPoolExecutor | None,
                 min_value: float = 0.25, min_tokens: int = 64, step_bytes: int = 4 << 20,
                 joiner: ThreadPoolExecutor | None = None):
        self.policy, self.model = policy, policy.model
        self.runtime, self.kv, self.seq_ids, self.tree = runtime, kv, seq_ids, tree
        self.host, self.disk = tier_of(tiers, Source.H), tier_of(tiers, Source.D)
        self.resident, self.slots, self.running = resident, slots, running
        self.disk_reader = disk_reader if self.disk is not None else None
        self.min_value, self.min_tokens, self.step_bytes = min_value, min_tokens, step_bytes
        self.tick_s = policy.resolution_s  # how often values may change: the engine's idle wake-ups
        self.last: OrderedDict[str, array] = OrderedDict()  # waiting session -> its last path
        self.job: _Job | None = None
        self._checked_at: tuple[int, int] | None = None  # the policy epoch the sessions were last ranked at
        self.jobs = self.prefetched = self.late = self.failed = self.pieces = 0
        self.max_piece_ms = 0.0
        # staged parts (joined on `joiner`, written beside the compute) where the KV allows it
        self.joiner = joiner if joiner is not None and kv.stages else None
        self.staged = 0
        self.max_stage_ms = 0.0

    # ------------------------------------------------------------ events
    def ended(self, session: str | None, state: str | None, tokens: list[int]) -> None:
        """A request of `session` ended with its hint's `state`; `tokens`: the path its KV holds (its cache
        prompt). A finished session (`done`) is not waited for: it is forgotten."""
        if session is None:
            return
        if state == "done" or len(tokens) < self.min_tokens:
            self.last.pop(session, None)
            return
        self.last[session] = array("i", tokens)  # 4 bytes a token: MAX_SESSIONS long paths stay small
        self.last.move_to_end(session)
        while len(self.last) > MAX_SESSIONS:
            self.last.popitem(last=False)

    def arrived(self, session: str | None) -> None:
        """A request of `session` is admitted: its job, if one runs, ends now (module docstring)."""
        if session is None:
            return
        self.last.pop(session, None)
        job = self.job
        if job is None or job.session != session:
            return
        self.late += 1
        if job.disk is not None:
            job.disk.cancel()  # a read in flight is dropped (its result, if any, is not waited for)
            job.disk = None
        self._advance(job, budget=None)
        if self.job is job:  # what is restored becomes an owner now
            self._finish(job)

    # ------------------------------------------------------------ each engine step
    def step(self, idle: bool) -> None:
        """Start a job for the most valuable waiting session that needs one, and restore the next piece
        (all of it when `idle`)."""
        if self.job is None:
            self.job = self._next_job()
        job = self.job
        if job is not None:
            self._advance(job, budget=None if idle else self.step_bytes)

    def _next_job(self) -> _Job | None:
        epoch = self.policy.epoch
        if epoch == self._checked_at:  # values change only with the epoch: ranked already
            return None
        self._checked_at = epoch
        value = self.model.values_at(epoch, epoch[0] * self.policy.resolution_s)
        # a wait a branch forked from came back through the branch: what the session left is the branch's now
        waiting = [(value(s), s) for s in self.last if self.model.state(s) in WAITING and not self.model.forked(s)]
        for v, session in sorted(waiting, key=lambda x: (-x[0], x[1])):
            if v < self.min_value:
                break
            job = self._plan(session, v)
            if job is not None:
                self._checked_at = None  # the next job may follow at once
                return job
        return None

    def _device_holder(self, tokens: list[int], walk) -> tuple[int, int | None, int]:
        """(leading tokens a device sequence holds, that sequence, leading tokens an owner holds)."""
        owned, owner = self.resident.take(walk)
        n, holder = owned, owner.seq_id if owner is not None else None
        for slot, held in slot_paths(self.slots, self.running()):
            k = common_prefix_len(held, tokens)
            if k > n:
                n, holder = k, slot.seq_id
        return n, holder, owned

    def _plan(self, session: str, value: float) -> _Job | None:
        tokens = self.last[session].tolist()
        with self.tree.mutex:
            walk = self.tree.match_prefix(tokens, touch=False)
            n_dev, holder, owned = self._device_holder(tokens, walk)
            h = self.host.lookup(tokens, walk) if self.host is not None else None
            d = self.disk.lookup(tokens, walk) if self.disk is not None else None
        h_len, d_len = (h.length if h is not None else 0), (d.length if d is not None else 0)
        end = max(h_len, d_len if self.disk_reader is not None else 0)
        if end - n_dev < self.min_tokens:
            return None  # the device holds it, or nothing stored holds more
        protect = self.resident.owner_of(holder) if holder is not None else None
        if not self.resident.make_room(end - owned, below=value, protect=protect):
            return None
        try:
            sid = self.seq_ids.take("owner")
        except SequenceIdsExhausted:
            return None
        job = _Job(session, tokens[:end], sid, first=n_dev, done=n_dev, end=end)
        try:
            if n_dev and holder is not None:
                self.runtime.seq_cp(holder, sid, 0, n_dev)
            if h_len > n_dev:
                job.pending.extend(self.host.load(h, n_dev))
            if d_len > max(h_len, n_dev) and self.disk_reader is not None:
                job.disk_start = max(h_len, n_dev)
                job.disk = self.disk_reader.submit(self.disk.load, d, job.disk_start)
        except Exception as exc:  # noqa: BLE001 - a prefetch may fail, never a request
            self._fail(job, exc)
            return None
        self.jobs += 1
        log.debug("prefetch %s (value %.3f): [%d, %d) of %d tokens, H to %d, D to %d", session, value, n_dev, end,
                  len(tokens), h_len, d_len)
        return job

    def _advance(self, job: _Job, budget: int | None) -> None:
        """Restore the next pieces of `job` (at most `budget` bytes; all when None), or move its staged part on
        (waited for when `budget` is None: the engine is idle, or the session's request came)."""
        try:
            if job.staged is not None and not self._staged_step(job, wait=budget is None):
                return  # its join or write is still under way
            if not job.pending and job.disk is not None and job.disk.done():
                segments, job.disk = job.disk.result(), None
                if job.done == job.disk_start:
                    job.pending.extend(segments)
                else:  # the host part stopped short: the disk part cannot join it
                    job.end = job.done
            if budget is not None and self.joiner is not None and self._join(job):
                return
            r = restore_pieces(self.kv, job.pending, job.sid, job.done, budget)
            job.done = r.done
            self.pieces += r.pieces
            self.max_piece_ms = max(self.max_piece_ms, r.max_piece_s * 1000.0)
        except Exception as exc:  # noqa: BLE001 - a prefetch may fail, never a request
            self._fail(job, exc)
            return
        if not job.pending and job.disk is None:
            self._finish(job)

    def _join(self, job: _Job) -> bool:
        """Send the job's pending segments (from `done` on) to the join thread, to be staged once joined; False when
        none is left."""
        assert self.joiner is not None
        segments, at = [], job.done
        while (piece := next_piece(job.pending, at, None)) is not None:
            segments.append(piece)
            at = piece.pos0 + piece.n_tokens
        if not segments:
            return False
        job.staged_end = at
        job.staged, job.writing = self.joiner.submit(self.kv.joined, segments), False
        return True

    def _staged_step(self, job: _Job, wait: bool) -> bool:
        """Move the staged part on: joined → its cells taken and its write started; written → done. True when it
        is written (the job goes on), False while its join or write runs."""
        assert job.staged is not None  # called only with a staged part
        if not job.writing:
            if not (wait or job.staged.done()):
                return False
            st = self.kv.stage(job.staged.result(), job.sid)
            self.max_stage_ms = max(self.max_stage_ms, st.stage_ms)
            self.staged += 1
            job.staged, job.writing = st.written, True
        assert job.staged is not None
        if not (wait or job.staged.done()):
            return False
        job.staged.result()
        job.done, job.staged, job.writing = job.staged_end, None, False
        return True

    def _finish(self, job: _Job) -> None:
        self.job = None
        n = min(job.done, job.end)
        brought_up = n - job.first
        if brought_up <= 0 or self.resident.adopt(job.tokens[:n], job.sid, job.session, brought_up) is None:
            self._release(job)
            return
        self.prefetched += brought_up

    def _fail(self, job: _Job, exc: Exception) -> None:
        log.warning("prefetch for session %s failed (%s); its next request restores as usual", job.session, exc)
        self.failed += 1
        if job.disk is not None:
            job.disk.cancel()
        self._release(job)  # a staged write still running is waited for there (seq_rm settles it)

    def _release(self, job: _Job) -> None:
        if self.job is job:
            self.job = None
        self.runtime.seq_rm(job.sid, -1, -1)
        self.seq_ids.give("owner", job.sid)

    def close(self) -> None:
        """After the engine stopped: a job in flight is dropped (its sequence and id given back)."""
        job = self.job
        if job is not None:
            if job.disk is not None:
                job.disk.cancel()
            self._release(job)

    def stats(self) -> dict:
        return {"enabled": True, "jobs": self.jobs, "prefetched_tokens": self.prefetched,
                "hit_tokens": self.resident.prefetch_hits, "miss_tokens": self.resident.prefetch_misses,
                "late": self.late, "failed": self.failed, "pieces": self.pieces,
                "max_piece_ms": round(self.max_piece_ms, 3), "staged": self.staged,
                "max_stage_ms": round(self.max_stage_ms, 3), "sessions_known": len(self.last),
                "min_value": self.min_value, "step_bytes": self.step_bytes}
