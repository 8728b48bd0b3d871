"""``python -m loadtest verify``: the exactly-once verification for a run driven by another tool
(Locust's ``test_stop`` hook calls it): ``--mark`` before the load prints where the run starts
in the inbox; ``--ledger FILE --start-id N`` after it checks the database against what was sent.

Its own process, so a gevent-patched Locust never runs asyncpg in its event loop.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.store.db import connect
from loadtest.harness import contract, report, verify
from loadtest.harness.sql import q
from loadtest.harness.stats import Ledger

HELP = "exactly-once verification of a run driven by another tool (Locust)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", required=True, help="the gateway's database")
    p.add_argument("--mark", action="store_true", help="print the inbox's current high-water id and exit")
    p.add_argument("--ledger", type=Path, help="JSON ledger of what was sent and acknowledged")
    p.add_argument("--start-id", type=int, default=0, help="the id --mark printed before the load")
    p.add_argument("--no-consumers", action="store_true", help="check the ingest edge only")
    p.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for consumers")


async def main(ns: argparse.Namespace) -> int:
    conn = await connect(ns.database_url)
    try:
        if ns.mark:
            print(int(await conn.fetchval(q("lt_inbox_max_id"))))
            return 0
        if ns.ledger is None:
            sys.stderr.write("verify needs --mark or --ledger\n")
            return 2
        run = contract.Run(ns)
        ledger = Ledger.from_json(ns.ledger.read_bytes())
        consumers = False if ns.no_consumers else None
        verdict = await verify.verify(conn, ledger.entries, ns.start_id, ns.drain_timeout, consumers)
    finally:
        await conn.close()
    for c in verdict.checks:
        run.check(c.name, c.ok, c.detail)
    text = report.table(
        ("check", "ok", "detail"), [(c.name, "yes" if c.ok else "NO", c.detail) for c in verdict.checks]
    )
    return run.finish({"verification": verdict.as_dict()}, text)
