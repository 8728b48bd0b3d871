"""A consumer process's hold on its lanes of ``webhook_inbox`` (``gateway.core.lanes``): it
beats as a member, learns the live members, and leases the lanes assigned to it; a member
that stops lets its lanes go, one that dies is seen dead by its connection, one that hangs
loses its lanes when their lease runs out."""

from __future__ import annotations

import os
import secrets
import socket
import time

from gateway.core.lanes import LaneSet, assign
from gateway.core.settings import Settings
from gateway.store import lanes
from gateway.store.db import Conn


def new_member() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class LaneLease:
    """Renews one member's lanes into its ``LaneSet`` (``refresh``, every third of the lease)."""

    def __init__(self, settings: Settings, lane_set: LaneSet, member: str | None = None) -> None:
        self.member = member or new_member()
        self.lanes = lane_set
        self.ttl = settings.consumer_lane_lease_s
        self._shards: dict[int, int] | None = None
        self._next = float("-inf")

    def due(self) -> bool:
        return time.monotonic() >= self._next

    async def refresh(self, conn: Conn) -> list[int]:
        """Beat, and lease the lanes assigned to this member among the live ones; the lanes it
        gained (a consumer should look at them at once: they may hold a backlog)."""
        await lanes.beat(conn, member=self.member)
        live = await lanes.members(conn, ttl_s=self.ttl)
        if self._shards is None:
            self._shards = await lanes.shards(conn)
        mine = assign([*live, self.member], self._shards).get(self.member, [])
        before = set(self.lanes.cursors)
        held = await lanes.lease(conn, member=self.member, lanes=mine, live=live, ttl_s=self.ttl)
        self.lanes.own(held, self._shards)
        self._next = time.monotonic() + self.ttl / 3
        return sorted(set(self.lanes.cursors) - before)

    async def leave(self, conn: Conn) -> None:
        await lanes.leave(conn, member=self.member)
        self.lanes.own([], self._shards or {})
