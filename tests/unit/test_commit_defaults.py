"""The group committer built without tuning arguments behaves as an operator who sets none."""

from __future__ import annotations

import asyncpg

from gateway.core.settings import Settings
from gateway.inbound.groupcommit import GroupCommitter


async def _never() -> asyncpg.Connection:
    raise AssertionError("the committer connects only when it writes")


def test_committer_defaults_are_the_settings_defaults() -> None:
    s = Settings.from_env({})
    gc = GroupCommitter(_never)
    assert gc._window == s.commit_window_ms / 1000
    assert gc._gather == s.commit_linger_gather
    assert gc._max_batch == s.commit_max_batch
    assert gc._max_inflight == s.commit_max_inflight
    assert gc._deadline == s.ack_deadline_ms / 1000
