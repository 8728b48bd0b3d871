"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

import asyncpg
from aiohttp import web

from gateway.consumer import ConsumerGroup
from gateway.groupcommit import GroupCommitter
from gateway.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
COMMITTER = web.AppKey("committer", GroupCommitter)
CONSUMERS = web.AppKey("consumers", ConsumerGroup)
