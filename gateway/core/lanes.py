"""Lanes and their cursors: which consumer process reads which lane, and how a lane's cursor
moves, without I/O.

``webhook_inbox`` is a log in 32 lanes (the group commit writes each batch into one lane, the
next batch into the next; a row staged otherwise takes ``id % 32``). A lane is read in commit
order by a cursor made of transaction snapshots, as PgQ does: ``done`` is a snapshot such that every row
written by a transaction visible in it has been read; a read takes the rows of transactions
visible in a later snapshot and not in ``done``, so a row that commits late with a smaller id
is read in a later window, never skipped. A window too large for one batch is read in
``(txid, id)`` order and remembered with its position (``window``, ``pos``).

On Citus a row's ``txid`` is its lane's own number instead (``inbox_heads``, given in commit
order within the lane), and a lane's snapshot now is "every number up to its head": the same
cursor, in numbers that stay with the lane when its shard moves to another worker.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

LANES = 32


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A ``pg_snapshot``: transactions below ``xmin`` are finished, from ``xmax`` on not yet
    started, and ``xip`` were in progress."""

    xmin: int
    xmax: int
    xip: tuple[int, ...] = ()
    # ``text`` once per snapshot: a batch sends every lane's cursor, and the lanes' cursors
    # share the snapshot their last batch took (32 lanes: 128 texts a batch, of one or two).
    _text: str | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """PostgreSQL's text form, ``xmin:xmax:xip,xip,...``."""
        lo, hi, rest = text.split(":")
        xip = tuple(int(x) for x in rest.split(",") if x)
        snap = cls(int(lo), int(hi), xip)
        if not (snap.xmin <= snap.xmax and all(snap.xmin <= x < snap.xmax for x in xip)):
            raise ValueError(f"not a snapshot: {text!r}")
        return snap

    def text(self) -> str:
        if self._text is None:
            text = f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in sorted(self.xip))}"
            object.__setattr__(self, "_text", text)
            return text
        return self._text

    def visible(self, txid: int) -> bool:
        """As ``pg_visible_in_snapshot``: finished before the snapshot was taken."""
        return txid < self.xmin or (txid < self.xmax and txid not in self.xip)


@dataclass(frozen=True, slots=True)
class Cursor:
    """One lane's cursor as stored in ``inbox_lanes`` (``version`` changes at every advance)."""

    lane: int
    version: int
    done: Snapshot
    window: Snapshot | None = None
    pos: tuple[int, int] | None = None  # (txid, id) of the last row read in ``window``

    def unread(self, txid: int, row_id: int, now: Snapshot) -> bool:
        """Whether a row of this lane is still to be read, judged against ``now``."""
        if self.done.visible(txid):
            return False
        if self.window is not None and self.pos is not None:
            return not (self.window.visible(txid) and (txid, row_id) <= self.pos)
        return True


# Above every row id (a start key's id for "from this txid on").
MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ReadParams:
    """The parameters of ``inbox_read`` for a set of lanes. The per-lane arrays have one entry
    per lane, at the lane's number (None for lanes not read)."""

    lanes: list[int]
    dones: list[str | None]
    windows: list[str | None]
    pos_txids: list[int | None]
    pos_ids: list[int | None]
    # Every unread row is past ``start`` in (txid, id) order, or is a row of a transaction in
    # ``in_progress``: a lane reading a window has read it up to its position; a lane without
    # one has read every transaction below its done snapshot's xmax but those it saw running.
    start: tuple[int, int]
    in_progress: list[int]


def start_of(c: Cursor) -> tuple[int, int]:
    """Where a lane's unread rows begin in (txid, id) order, but for its done snapshot's
    running transactions (when it has no window)."""
    if c.window is not None and c.pos is not None:
        return c.pos
    return (c.done.xmax - 1, MAX_ID)


def read_params(cursors: Sequence[Cursor]) -> ReadParams:
    if not cursors:
        raise ValueError("no lanes to read")
    start = min(start_of(c) for c in cursors)
    # A lane with a window read its done snapshot's running transactions first (they come
    # first in (txid, id) order); one without a window has them still to read.
    running = sorted({x for c in cursors if c.window is None for x in c.done.xip if x <= start[0]})
    per: list[Cursor | None] = [None] * LANES
    for c in cursors:
        per[c.lane] = c
    return ReadParams(
        lanes=[c.lane for c in cursors],
        dones=[None if c is None else c.done.text() for c in per],
        windows=[None if c is None or c.window is None else c.window.text() for c in per],
        pos_txids=[None if c is None or c.pos is None else c.pos[0] for c in per],
        pos_ids=[None if c is None or c.pos is None else c.pos[1] for c in per],
        start=start,
        in_progress=running,
    )


def advance(
    cursors: Sequence[Cursor], now: Mapping[int, Snapshot], last: tuple[int, int], exhausted: bool
) -> list[Cursor]:
    """The lanes' cursors after a batch that read, in ``(txid, id)`` order, every unread row up
    to ``last`` of each lane's window (a lane without one: ``now[lane]``, the lane's snapshot
    when it was read). ``exhausted``: the read returned everything it found, so each window is
    read to its end."""
    out: list[Cursor] = []
    for c in cursors:
        window = c.window or now[c.lane]
        if exhausted:
            out.append(Cursor(c.lane, c.version + 1, window))
        else:
            pos = last if c.pos is None or c.window is None else max(c.pos, last)
            out.append(Cursor(c.lane, c.version + 1, c.done, window, pos))
    return out


def close_windows(cursors: Sequence[Cursor]) -> list[Cursor]:
    """After a read of these lanes that found nothing: each window is read to its end, its
    snapshot the new done one (a lane without a window is as it was)."""
    return [Cursor(c.lane, c.version + 1, c.window) if c.window is not None else c for c in cursors]


def assign(members: Iterable[str], shards: Mapping[int, int]) -> dict[str, list[int]]:
    """Lanes per live member: the lanes sorted by (shard, lane) dealt in contiguous runs, so
    every member computes the same answer and a shard's lanes mostly stay with one member."""
    ordered = sorted(set(members))
    if not ordered:
        return {}
    lanes = sorted(shards, key=lambda lane: (shards[lane], lane))
    n = len(ordered)
    out: dict[str, list[int]] = {m: [] for m in ordered}
    for i, lane in enumerate(lanes):
        out[ordered[i * n // len(lanes)]].append(lane)
    return out


class LaneSet:
    """A process's lanes and their cursors as last written, handed out to its consumer loops so
    that no two loops read one lane at once. A lane whose last batch may or may not have
    committed is *stale*: its cursor is read again before the next read. A lane out with a loop
    when another loop looked for lanes to read is *wanted*: what woke that other loop may have
    committed in it after the holder's read began, and nobody else may read it, so the holder
    reads it again after its batch (else the row waits for the next wake-up or poll)."""

    def __init__(self) -> None:
        self.cursors: dict[int, Cursor] = {}
        self.shards: dict[int, int] = {}
        self.out: set[int] = set()
        self.stale: set[int] = set()
        self.wanted: set[int] = set()
        self._last_shard = -1

    def owned(self) -> list[int]:
        return sorted(self.cursors)

    def own(self, cursors: Iterable[Cursor], shards: Mapping[int, int]) -> None:
        """The lanes the lease holds now, with their cursors as the lease read them. A lane out
        with a loop keeps its cursor until it comes back (its batch may have moved it)."""
        fresh = {c.lane: c for c in cursors}
        for lane in list(self.cursors):
            if lane not in fresh:
                del self.cursors[lane]
                self.stale.discard(lane)
        for lane, c in fresh.items():
            if lane not in self.cursors or (lane not in self.out and lane in self.stale):
                self.cursors[lane] = c
                self.stale.discard(lane)
        self.shards = {lane: shards.get(lane, 0) for lane in self.cursors}

    def take(self, most: int | None = None, skip: Collection[int] = ()) -> list[Cursor]:
        """Free lanes of one shard, at most ``most``: the shard with most free lanes, among
        equals the next after the shard taken last (so that every shard is read in turn), and
        none of the shards in ``skip``."""
        free = [lane for lane in sorted(self.cursors) if lane not in self.out]
        # Lanes of the shards looked at that other loops hold (a loop's own lanes are in the
        # shards it skips: it read them already).
        self.wanted.update(lane for lane in self.out if self.shards.get(lane, 0) not in skip)
        by_shard: dict[int, list[int]] = {}
        for lane in free:
            shard = self.shards.get(lane, 0)
            if shard not in skip:
                by_shard.setdefault(shard, []).append(lane)
        if not by_shard:
            return []
        last = self._last_shard
        shard = max(by_shard, key=lambda s: (len(by_shard[s]), s > last, -s))
        self._last_shard = shard
        lanes = by_shard[shard]
        if most is not None:
            lanes = lanes[: max(1, most)]
        self.out.update(lanes)
        return [self.cursors[lane] for lane in lanes]

    def take_lane(self, lane: int) -> list[Cursor]:
        """One lane alone (the caller checked it is owned and free)."""
        self.out.add(lane)
        return [self.cursors[lane]]

    def drop(self, lanes: Iterable[int]) -> None:
        """Lanes found to be another member's now."""
        for lane in lanes:
            self.cursors.pop(lane, None)
            self.stale.discard(lane)
            self.wanted.discard(lane)
            self.shards.pop(lane, None)

    def give_back(self, lanes: Iterable[int], advanced: Iterable[Cursor] | None) -> bool:
        """Lanes back from a loop: with their cursors as its batch committed them, or None when
        the batch's fate is unknown (stale until read again). True when one of them was wanted
        meanwhile: the loop reads again."""
        lanes = list(lanes)
        self.out.difference_update(lanes)
        wanted = not self.wanted.isdisjoint(lanes)
        self.wanted.difference_update(lanes)
        if advanced is None:
            self.stale.update(lane for lane in lanes if lane in self.cursors)
            return wanted
        for c in advanced:
            if c.lane in self.cursors:
                self.cursors[c.lane] = c
        return wanted

    def refresh(self, cursors: Iterable[Cursor]) -> None:
        """Stale lanes' cursors as read again."""
        for c in cursors:
            if c.lane in self.cursors:
                self.cursors[c.lane] = c
                self.stale.discard(c.lane)
