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


def test_lanes_a_sibling_looked_for_are_read_again_by_their_holder() -> None:
    """Loop B, woken by a NOTIFY while loop A holds every lane, reads nothing: the row that
    NOTIFY announced may have committed after A's read began, so A reads its lanes again."""
    s = lane_set(dict.fromkeys(range(4), 0))
    a = s.take()
    assert s.take() == []  # loop B
    assert s.give_back([c.lane for c in a], a) is True
    again = s.take()  # A's next read
    assert s.give_back([c.lane for c in again], again) is False  # nobody looked meanwhile


def test_only_the_lanes_looked_for_are_wanted() -> None:
    s = lane_set({0: 1, 1: 1, 2: 2, 3: 3})
    a = s.take()  # shard 1's lanes, loop A
    assert sorted(c.lane for c in a) == [0, 1]
    b = s.take(skip={2})  # loop B passes over shard 2 (and so does not want lanes there)
    assert [c.lane for c in b] == [3]
    assert s.give_back([0, 1], a) is True  # B looked at shard 1 while A held it
    assert s.give_back([3], b) is False


def test_a_loop_does_not_want_its_own_lanes() -> None:
    """A step reads shard after shard, skipping those it took: its later looks want nothing."""
    s = lane_set({0: 1, 1: 1, 2: 2})
    first = s.take()
    second = s.take(skip={1})
    assert s.take(skip={1, 2}) == []
    assert s.give_back([c.lane for c in first + second], first + second) is False


def test_a_dropped_lane_is_wanted_no_more() -> None:
    s = lane_set({0: 0, 1: 0})
    a = s.take()
    s.take()
    s.drop([0, 1])
    assert s.give_back([c.lane for c in a], None) is False
