"""The console's pages (GET): each linkable, its filters in the URL, every list a keyset page."""

from __future__ import annotations

import heapq
from datetime import UTC, datetime
from typing import Any

import aiohttp_jinja2
import asyncpg
from aiohttp import web

from gateway.core import console as pure
from gateway.core import stdwebhooks
from gateway.core.enums import OutboxState
from gateway.core.operator_input import text_problem
from gateway.store import audit, dead_events, inbox, outbox, pacing
from gateway.store import console as reads

POOL = web.AppKey("console_pool", asyncpg.Pool)
HANDLERS = web.AppKey("console_handlers", tuple)
# GATEWAY_RECONCILE_WINDOW_S: an unknown send is not released inside it without a confirmation.
WINDOW_S = web.AppKey("console_reconcile_window_s", float)
KINDS = ("all", "row", "message", "status", "account_error", "account_update", "bad")
PAGE = reads.PAGE
# A destination in a path: what a destination's name may be (any other path is not found).
DESTINATION = "{name:[a-z0-9][a-z0-9_-]{0,62}}"


def routes() -> list[web.RouteDef]:
    return [
        web.get("/", overview),
        web.get("/dead", dead_list),
        web.get(r"/dead/{ident:[RE]\d{1,19}}", dead_show),
        web.get(r"/dead/{ident:[RE]\d{1,19}}/raw", dead_raw),
        web.get("/outbox", outbox_list),
        web.get("/outbox/send", outbox_show),
        web.get("/destinations", destinations),
        web.get(f"/destinations/{DESTINATION}", deliveries_list),
        web.get("/senders", senders),
        web.get("/inbound", inbound_list),
        web.get("/inbound/message", inbound_show),
        web.get("/audit", audit_list),
    ]


def bad(request: web.Request, why: str) -> web.Response:
    response = aiohttp_jinja2.render_template("error.html", request, {"title": "Bad request", "why": why})
    response.set_status(400)
    return response


class BadFilter(ValueError):
    pass


def text(request: web.Request, name: str, max_len: int = 200) -> str | None:
    value = request.query.get(name, "").strip()
    if (problem := text_problem(value, max_len)) is not None:
        raise BadFilter(f"{name} {problem}")
    return value or None


def when(request: web.Request, name: str) -> datetime | None:
    raw = text(request, name, 40)
    if raw is None:
        return None
    try:
        return pure.parse_when(raw, datetime.now(UTC))
    except ValueError as exc:
        raise BadFilter(f"{name}: {exc}") from None


def choice(request: web.Request, name: str, options: tuple[str, ...], default: str | None) -> str | None:
    value = text(request, name, 40) or default
    if value is not None and value not in options:
        raise BadFilter(f"{name} must be one of {', '.join(options)}")
    return value


def integer(raw: str | None) -> int | None:
    if raw is None or raw == "-":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadFilter("a page cursor is malformed") from None
    if not 0 < value < 2**63:
        raise BadFilter("a page cursor is out of range")
    return value


def query(request: web.Request, **changes: object) -> str:
    """The current URL's query with ``changes`` (None removes), for the next page's link."""
    params = {k: v for k, v in request.query.items() if k not in changes}
    params.update({k: str(v) for k, v in changes.items() if v is not None})
    from urllib.parse import urlencode

    return "?" + urlencode(params)


def filters(handler: Any) -> Any:
    """A page whose filters are wrong says which, with a 400."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            result = await handler(request)
        except BadFilter as exc:
            return bad(request, str(exc))
        return result  # type: ignore[no-any-return]

    wrapped.__name__ = handler.__name__
    return wrapped


# --- overview ------------------------------------------------------------------------------


@filters
async def overview(request: web.Request) -> web.StreamResponse:
    pool = request.app[POOL]
    n = await reads.overview(pool)
    dests = await reads.destinations(pool)
    breakers = [b for b in await pacing.list_breakers(pool) if b["state"] != "closed"]
    passes = await audit.passes(pool)
    now = datetime.now(UTC)
    failing = any(
        p.last_failed_at is not None and (p.last_ok_at is None or p.last_failed_at > p.last_ok_at)
        for p in passes
    )
    numbers = pure.Numbers(
        inbox_pending=n["inbox_pending"],
        inbox_lag_s=n["inbox_oldest_due_s"],
        dead_rows=n["dead_rows"],
        dead_events=n["dead_events"],
        outbox_review=n["outbox_review"],
        outbox_unknown=n["outbox_unknown"],
        outbox_failed=n["outbox_failed"],
        failed_deliveries=sum(d["failed"] for d in dests),
        open_destination_breakers=sum(d["breaker_state"] != "closed" for d in dests),
        disabled_destinations=sum(not d["enabled"] for d in dests),
        open_sender_breakers=len(breakers),
        partitions_ahead_days=n["partitions_ahead_days"],
        maintenance_failing=failing,
    )
    context = {
        "n": n,
        "needs": pure.needs(numbers, reads.LIST_CAP),
        "rate": n["ingest_last_minute"] / 60,
        "dests": dests,
        "passes": passes,
        "cap": reads.LIST_CAP,
        "now": now,
    }
    return aiohttp_jinja2.render_template("overview.html", request, context)


# --- dead items ----------------------------------------------------------------------------


@filters
async def dead_list(request: web.Request) -> web.StreamResponse:
    """Dead whole webhooks (R, newest id first) and dead events (E, newest first), merged by
    receipt time; each has its own cursor (``r``, ``e``; ``-``: that list is done)."""
    kind = choice(request, "kind", KINDS, "all")
    state = choice(request, "state", ("dead", "retry"), "dead")
    since, until = when(request, "since"), when(request, "until")
    r_raw, e_raw = text(request, "r", 40), text(request, "e", 40)
    pool = request.app[POOL]
    rows: list[Any] = []
    items: list[Any] = []
    if kind in ("all", "row") and state == "dead" and r_raw != "-":
        rows = await reads.dead_rows(pool, before=integer(r_raw), since=since, until=until, limit=PAGE + 1)
    if kind != "row" and e_raw != "-":
        after = pure.parse_cursor(e_raw)
        cursor = (after[0], after[1]) if after and after[0] is not None else None
        items = await reads.dead_items(
            pool, state=state or "dead", kind=None if kind == "all" else kind, after=cursor,
            since=since, until=until, limit=PAGE + 1,
        )  # fmt: skip
    shown: list[tuple[str, Any]] = []
    taken = {"R": 0, "E": 0}
    merged = heapq.merge(
        (("R", r) for r in rows), (("E", i) for i in items), key=lambda t: t[1]["received_at"], reverse=True
    )
    for tag, rec in merged:
        if len(shown) == PAGE:
            break
        shown.append((tag, rec))
        taken[tag] += 1
    last_r = next((rec for tag, rec in reversed(shown) if tag == "R"), None)
    last_e = next((rec for tag, rec in reversed(shown) if tag == "E"), None)
    r_done = r_raw == "-" or not rows or (taken["R"] == len(rows) and len(rows) <= PAGE)
    e_done = e_raw == "-" or not items or (taken["E"] == len(items) and len(items) <= PAGE)
    next_r = "-" if r_done else (str(last_r["id"]) if last_r else r_raw)
    next_e = "-" if e_done else (pure.cursor(last_e["received_at"], last_e["id"]) if last_e else e_raw)
    more = None if r_done and e_done else query(request, r=next_r, e=next_e)
    context = {
        "shown": shown,
        "kind": kind,
        "state": state,
        "kinds": KINDS,
        "since": request.query.get("since", ""),
        "until": request.query.get("until", ""),
        "more": more,
        "first": query(request, r=None, e=None),
    }
    return aiohttp_jinja2.render_template("dead.html", request, context)


async def _dead_record(request: web.Request) -> tuple[str, int, Any, bytes]:
    ident = request.match_info["ident"]
    kind, number = ident[0], int(ident[1:])
    if number > 2**63 - 1:
        raise web.HTTPNotFound()
    pool = request.app[POOL]
    if kind == "R":
        r = await inbox.get(pool, inbox_id=number)
        data = None if r is None else bytes(r["body"])
    else:
        r = await dead_events.get(pool, item_id=number)
        data = None if r is None else bytes(r["fragment"])
    if r is None or data is None:
        raise web.HTTPNotFound(text=f"no {ident}")
    return kind, number, r, data


async def dead_show(request: web.Request) -> web.StreamResponse:
    kind, number, r, data = await _dead_record(request)
    raw, cut = pure.shown_text(data)
    context = {
        "kind": kind,
        "ident": f"{kind}{number}",
        "r": r,
        "size": len(data),
        "pretty": pure.pretty_json(data),
        "raw": raw,
        "cut": cut,
        "replayable": r["state"] == "dead",
    }
    return aiohttp_jinja2.render_template("dead_item.html", request, context)


async def dead_raw(request: web.Request) -> web.StreamResponse:
    """The exact bytes, as a download: never rendered by the browser as a page."""
    kind, number, _r, data = await _dead_record(request)
    return web.Response(
        body=data,
        content_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{kind}{number}.bin"'},
    )


# --- outbox --------------------------------------------------------------------------------

STATES = tuple(s.value for s in OutboxState)


@filters
async def outbox_list(request: web.Request) -> web.StreamResponse:
    key, wamid = text(request, "key"), text(request, "wamid")
    recipient, tenant = text(request, "recipient"), text(request, "tenant")
    state = choice(request, "state", STATES, None)
    pool = request.app[POOL]
    if key is not None or wamid is not None:
        page = reads.Page(await reads.outbox_exact(pool, key=key, wamid=wamid, tenant=tenant))
    else:
        page = await reads.outbox_page(
            pool, before=integer(text(request, "after", 40)), recipient=recipient, tenant=tenant,
            state=state, limit=PAGE,
        )  # fmt: skip
    context = {
        "page": page,
        "f": {"key": key, "wamid": wamid, "recipient": recipient, "tenant": tenant, "state": state},
        "states": STATES,
        "more": query(request, after=page.after) if page.after else None,
        "scan": reads.SCAN,
        "releasable": state in ("review", "unknown", "failed"),
        "cancellable": state in ("pending", "review", "unknown", "failed"),
    }
    return aiohttp_jinja2.render_template("outbox.html", request, context)


@filters
async def outbox_show(request: web.Request) -> web.StreamResponse:
    """One send's whole story: the request, its attempts and the provider's last answer, and
    the statuses that came back, in order."""
    tenant, key = text(request, "tenant"), text(request, "key")
    if tenant is None or key is None:
        raise BadFilter("a send is named by its tenant and key")
    pool = request.app[POOL]
    r = await reads.outbox_row(pool, tenant=tenant, key=key)
    if r is None:
        raise web.HTTPNotFound(text="no such send")
    statuses = await reads.statuses(pool, wamid=r["wamid"]) if r["wamid"] else []
    early = outbox.releasable_at(r, request.app[WINDOW_S])
    context = {
        "r": r,
        "attempts": await reads.attempts(pool, outbox_id=r["id"], tenant=tenant, key=key),
        "payload": pure.pretty_json(_json_bytes(r["payload"])) or "",
        "statuses": statuses,
        "releasable": r["state"] in ("review", "unknown", "failed"),
        "cancellable": r["state"] in ("pending", "review", "unknown", "failed"),
        # Inside its reconcile window: the release form asks for the confirmation.
        "early": early if early is not None and early > datetime.now(UTC) else None,
    }
    return aiohttp_jinja2.render_template("outbox_row.html", request, context)


def _json_bytes(value: Any) -> bytes:
    import orjson

    return orjson.dumps(value)


# --- destinations, deliveries, senders ----------------------------------------------------


def masked(d: Any) -> str:
    """A destination's secrets as the command line shows them."""
    out = stdwebhooks.mask_secret(d["secret"])
    if d["previous_secret"] is not None and d["previous_secret_until"] is not None:
        until = d["previous_secret_until"]
        out += f" (and {stdwebhooks.mask_secret(d['previous_secret'])} until {until:%Y-%m-%d %H:%M})"
    return out


async def destinations(request: web.Request) -> web.StreamResponse:
    dests = await reads.destinations(request.app[POOL])
    context = {"dests": [(d, masked(d)) for d in dests], "cap": reads.LIST_CAP}
    return aiohttp_jinja2.render_template("destinations.html", request, context)


@filters
async def deliveries_list(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    pool = request.app[POOL]
    dest = await pool.fetchrow("SELECT id, name FROM destinations WHERE name = $1", name)
    if dest is None:
        raise web.HTTPNotFound(text="no such destination")
    state = choice(request, "state", ("pending", "delivered", "failed"), None)
    since, until = when(request, "since"), when(request, "until")
    after = pure.parse_cursor(text(request, "after", 40))
    cursor = (after[0], after[1]) if after and after[0] is not None else None
    rows, nxt, scanned = await reads.deliveries_page(
        pool,
        destination_id=dest["id"],
        destination=name,
        state=state,
        after=cursor,
        since=since,
        until=until,
        limit=PAGE,
    )
    context = {
        "name": name,
        "rows": rows,
        "state": state,
        "since": request.query.get("since", ""),
        "until": request.query.get("until", ""),
        "scanned": scanned,
        "more": query(request, after=pure.cursor(*nxt)) if nxt else None,
    }
    return aiohttp_jinja2.render_template("deliveries.html", request, context)


async def senders(request: web.Request) -> web.StreamResponse:
    breakers = await pacing.list_breakers(request.app[POOL])
    now = datetime.now(UTC).timestamp()
    context = {"breakers": breakers, "now": now}
    return aiohttp_jinja2.render_template("senders.html", request, context)


# --- inbound messages ----------------------------------------------------------------------


@filters
async def inbound_list(request: web.Request) -> web.StreamResponse:
    wamid, customer = text(request, "wamid"), text(request, "customer")
    pool = request.app[POOL]
    if wamid is not None:
        page = reads.Page(await reads.inbound_by_wamid(pool, wamid=wamid))
    else:
        page = await reads.inbound_page(
            pool, before=integer(text(request, "after", 40)), customer=customer, limit=PAGE
        )
    context = {
        "page": page,
        "wamid": wamid,
        "customer": customer,
        "scan": reads.SCAN,
        "more": query(request, after=page.after) if page.after else None,
    }
    return aiohttp_jinja2.render_template("inbound.html", request, context)


@filters
async def inbound_show(request: web.Request) -> web.StreamResponse:
    """What the gateway did with one inbound message: its key, handlers, deliveries, reply."""
    wamid = text(request, "wamid")
    if wamid is None:
        raise BadFilter("a message is named by its wamid")
    pool = request.app[POOL]
    found = await reads.inbound_by_wamid(pool, wamid=wamid)
    if not found:
        raise web.HTTPNotFound(text="no such message")
    m = found[0]
    key = f"msg:{wamid}" if m["source"] == "meta" else None
    story = await reads.event_story(pool, key=key or "", inbox_id=m["inbox_id"]) if key else []
    context = {
        "m": m,
        "message": pure.pretty_json(_json_bytes(m["message"])) or "",
        "key": key,
        "story": story,
        "replies": await reads.replies(pool, wamid=wamid),
        "handlers": request.app[HANDLERS],
    }
    return aiohttp_jinja2.render_template("inbound_item.html", request, context)


# --- audit log -----------------------------------------------------------------------------


@filters
async def audit_list(request: web.Request) -> web.StreamResponse:
    actor, action = text(request, "actor", 100), text(request, "action", 100)
    entries = await audit.page(
        request.app[POOL],
        before=integer(text(request, "after", 40)),
        actor=actor,
        action=action,
        limit=PAGE + 1,
    )
    more = query(request, after=entries[PAGE - 1].id) if len(entries) > PAGE else None
    context = {"entries": entries[:PAGE], "actor": actor, "action": action, "more": more}
    return aiohttp_jinja2.render_template("audit.html", request, context)
