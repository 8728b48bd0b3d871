"""A consumer's lanes are read one shard at a time (on Citus: one worker per statement): every
shard gets its turn, and a step can skip the shards it found empty."""

from __future__ import annotations

from gateway.core.lanes import Cursor, LaneSet, Snapshot


def lane_set(shards: dict[int, int]) -> LaneSet:
    s = LaneSet()
    s.own([Cursor(lane, 1, Snapshot(1, 1)) for lane in shards], shards)
    return s


def test_equal_shards_are_taken_in_turn() -> None:
    s = lane_set({0: 5, 1: 2, 2: 9, 3: 2, 4: 5, 5: 9})
    seen = []
    for _ in range(4):
        taken = s.take()
        seen.append(sorted(c.lane for c in taken))
        s.give_back([c.lane for c in taken], taken)
    assert seen == [[1, 3], [0, 4], [2, 5], [1, 3]]


def test_skipped_shards_are_never_taken() -> None:
    s = lane_set({0: 1, 1: 1, 2: 1, 3: 2})
    assert sorted(c.lane for c in s.take()) == [0, 1, 2]  # the shard with most free lanes
    s.give_back([0, 1, 2], None)
    assert sorted(c.lane for c in s.take(skip={1})) == [3]
    assert s.take(skip={1}) == []  # shard 2's lane is out, shard 1 skipped
    assert sorted(c.lane for c in s.take()) == [0, 1, 2]


def test_one_server_is_one_shard() -> None:
    s = lane_set(dict.fromkeys(range(32), 0))
    assert len(s.take()) == 32
    assert s.take() == []
