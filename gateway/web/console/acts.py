"""The console's actions (POST only; the middleware has checked the session, the CSRF token and
that the login may act). Each calls the same function as the command line
(gateway.operator.actions), which writes the audit entry. A bulk action first shows how many
rows it would touch and asks for confirmation; the confirmation carries the resolved times,
so "2h" means the same two hours when it is confirmed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import aiohttp_jinja2
import asyncpg
from aiohttp import web
from multidict import MultiDictProxy

from gateway.core import console as pure
from gateway.core.operator_input import text_problem
from gateway.operator import actions
from gateway.store import console as reads
from gateway.store import outbox
from gateway.web.console import auth
from gateway.web.console.pages import DESTINATION, POOL, WINDOW_S, bad

MAX_SELECTED = 500
# The console's --i-know-it-may-duplicate: releasing an unknown send inside its reconcile window.
MAY_DUPLICATE = "may_duplicate"
MAY_DUPLICATE_LABEL = "I know the customer may get it twice"


def routes() -> list[web.RouteDef]:
    return [
        web.post("/dead/replay", dead_replay),
        web.post("/outbox/release", outbox_one),
        web.post("/outbox/cancel", outbox_one),
        web.post("/outbox/bulk", outbox_bulk),
        web.post(f"/destinations/{DESTINATION}/{{verb:enable|disable}}", destination_enable),
        web.post(f"/destinations/{DESTINATION}/rotate", destination_rotate),
        web.post("/deliveries/replay", deliveries_replay),
        web.post("/senders/resume", senders_resume),
    ]


class BadForm(ValueError):
    pass


def actor(request: web.Request) -> actions.Actor:
    login: pure.Login = request[auth.LOGIN]
    return actions.Actor(login.name, "console")


def field(form: MultiDictProxy[Any], name: str, max_len: int = 200) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_len:
        raise BadForm(f"{name} is not a short text")
    if (problem := text_problem(value.strip(), max_len)) is not None:
        raise BadForm(f"{name} {problem}")
    return value.strip() or None


def when(form: MultiDictProxy[Any], name: str) -> datetime | None:
    raw = field(form, name, 40)
    if raw is None:
        return None
    try:
        return pure.parse_when(raw, datetime.now(UTC))
    except ValueError as exc:
        raise BadForm(f"{name}: {exc}") from None


def done(request: web.Request, title: str, lines: list[str], back: str, status: int = 200) -> web.Response:
    response = aiohttp_jinja2.render_template(
        "done.html", request, {"title": title, "lines": lines, "back": pure.safe_next(back)}
    )
    response.set_status(status)
    return response


def confirm(
    request: web.Request,
    *,
    title: str,
    count: str,
    fields: list[tuple[str, str]],
    back: str,
    option: tuple[str, str] | None = None,
) -> web.Response:
    """The confirmation step: how many rows, and a form that repeats the request with
    ``confirm=yes`` (and the times resolved); ``option``: a checkbox (name, label) it may add."""
    context: dict[str, Any] = {"title": title, "count": count, "fields": fields, "back": back}
    context |= {"action": request.path, "option": option}
    return aiohttp_jinja2.render_template("confirm.html", request, context)


def at_least(n: int) -> str:
    return f"at least {n:,}".replace(",", " ") if n >= reads.CAP else f"{n:,}".replace(",", " ")


def _iso(t: datetime | None) -> str:
    return "" if t is None else t.isoformat()


def guarded(handler: Any) -> Any:
    """Bad form input is a 400 page; a refusal is shown as the action's result (409)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            result = await handler(request)
        except BadForm as exc:
            return bad(request, str(exc))
        except outbox.AmbiguousKey as exc:
            return done(request, "Refused", [f"the key is used by tenants {exc}: pick one"], "/outbox", 409)
        except (LookupError, ValueError) as exc:
            if isinstance(exc, asyncpg.InterfaceError):
                raise  # the driver's text quotes the values it was given: the 503 page says less
            return done(request, "Refused", [str(exc)], request.headers.get("Referer", "/"), 409)
        return result  # type: ignore[no-any-return]

    wrapped.__name__ = handler.__name__
    return wrapped


@guarded
async def dead_replay(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    ids = [i for i in form.getall("id", []) if isinstance(i, str)]
    if len(ids) > MAX_SELECTED:
        raise BadForm(f"select at most {MAX_SELECTED} items (or replay a time range)")
    rows: list[int] = []
    items: list[int] = []
    for raw in ids:
        if raw[:1] not in ("R", "E") or not (raw[1:].isascii() and raw[1:].isdigit()) or len(raw) > 20:
            raise BadForm(f"not a dead item: {raw[:30]!r}")
        (rows if raw[0] == "R" else items).append(int(raw[1:]))
    every = field(form, "range") == "yes"
    since, until = when(form, "since"), when(form, "until")
    if every == bool(ids):
        raise BadForm("select items, or replay a time range")
    if (every or len(ids) > 1) and field(form, "confirm") != "yes":
        if every:
            n_rows, n_items = await reads.dead_count(request.app[POOL], since=since, until=until)
            count = f"{at_least(n_rows)} dead webhook(s) and {at_least(n_items)} dead event(s)"
            fields = [("range", "yes"), ("since", _iso(since)), ("until", _iso(until))]
        else:
            count = f"{len(ids)} selected item(s)"
            fields = [("id", str(i)) for i in ids]
        return confirm(request, title="Replay dead items", count=count, fields=fields, back="/dead")
    async with request.app[POOL].acquire() as conn:
        result = await actions.dead_replay(
            conn, actor(request), rows=rows, items=items, every=every, since=since, until=until
        )
    back = f"/dead/{ids[0]}" if len(ids) == 1 else "/dead"
    return done(request, "Replayed", result.lines(), back)


@guarded
async def outbox_one(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    key, tenant = field(form, "key"), field(form, "tenant")
    if key is None:
        raise BadForm("which key?")
    back = "/outbox?" + urlencode({"key": key} if tenant is None else {"key": key, "tenant": tenant})
    async with request.app[POOL].acquire() as conn:
        if request.path.endswith("/release"):
            try:
                line = await actions.release(
                    conn, actor(request), key, tenant, window_s=request.app[WINDOW_S],
                    may_duplicate=field(form, MAY_DUPLICATE) == "yes",
                )  # fmt: skip
            except outbox.TooEarly as exc:
                hint = f"to release it now anyway, tick '{MAY_DUPLICATE_LABEL}' on the send's page"
                page = "/outbox/send?" + urlencode({"tenant": tenant or "", "key": key})
                return done(request, "Refused", [str(exc), hint], page if tenant else back, 409)
        else:
            line = await actions.cancel(conn, actor(request), key, tenant)
    return done(request, "Done", [line], back)


@guarded
async def outbox_bulk(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    action, state, tenant = field(form, "action"), field(form, "state"), field(form, "tenant")
    if action not in ("release", "cancel") or state is None:
        raise BadForm("a bulk action needs release or cancel, and a state")
    since, until = when(form, "since"), when(form, "until")
    lo, hi = (None if t is None else t.timestamp() for t in (since, until))
    window_s = request.app[WINDOW_S]
    if field(form, "confirm") != "yes":
        n = await reads.outbox_bulk_count(request.app[POOL], state=state, since=lo, until=hi, tenant=tenant)
        fields = [("action", action), ("state", state), ("tenant", tenant or "")]
        fields += [("since", _iso(since)), ("until", _iso(until))]
        note = " (rows the provider accepted are refused)" if action == "release" else ""
        option = None
        if action == "release" and state == "unknown":
            note = (
                " (rows the provider accepted are refused, and so are rows unknown for less than the "
                f"reconcile window, {window_s:g} s, unless you tick the box)"
            )
            option = (MAY_DUPLICATE, f"{MAY_DUPLICATE_LABEL}: release those too")
        return confirm(
            request, title=f"{action.capitalize()} {state} sends",
            count=f"{at_least(n)} {state} row(s){note}", fields=fields, back=f"/outbox?state={state}",
            option=option,
        )  # fmt: skip
    async with request.app[POOL].acquire() as conn:
        result = await actions.outbox_bulk(
            conn, actor(request), action, state=state, since=lo, until=hi, tenant=tenant,
            window_s=window_s, may_duplicate=action == "release" and field(form, MAY_DUPLICATE) == "yes",
        )  # fmt: skip
    verb = "released" if action == "release" else "cancelled"
    lines = actions.bulk_lines(verb, result)
    if result.early:
        lines.append(f"to release them now anyway, run this again and tick '{MAY_DUPLICATE_LABEL}'")
    return done(request, "Done", lines, f"/outbox?state={state}")


@guarded
async def destination_enable(request: web.Request) -> web.StreamResponse:
    name, verb = request.match_info["name"], request.match_info["verb"]
    async with request.app[POOL].acquire() as conn:
        line = await actions.set_enabled(conn, actor(request), name, enabled=verb == "enable")
    return done(request, "Done", [line], "/destinations")


@guarded
async def destination_rotate(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    try:
        grace_h = float(field(form, "grace_h", 10) or "24")
    except ValueError:
        raise BadForm("grace_h must be a number of hours") from None
    name = request.match_info["name"]
    async with request.app[POOL].acquire() as conn:
        rotated = await actions.rotate_secret(conn, actor(request), name, grace_h=grace_h)
    context = {"name": name, "secret": rotated.secret, "until": rotated.previous_until}
    return aiohttp_jinja2.render_template("secret.html", request, context)


@guarded
async def deliveries_replay(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    destination, state = field(form, "destination"), field(form, "state") or "failed"
    if state not in ("failed", "delivered"):
        raise BadForm("only failed or delivered deliveries are replayed")
    since, until = when(form, "since"), when(form, "until")
    back = f"/destinations/{destination}" if destination else "/destinations"
    if field(form, "confirm") != "yes":
        n = await reads.deliveries_count(
            request.app[POOL], destination=destination, state=state, since=since, until=until
        )
        fields = [("destination", destination or ""), ("state", state)]
        fields += [("since", _iso(since)), ("until", _iso(until))]
        return confirm(
            request, title=f"Replay {state} deliveries", count=f"{at_least(n)} {state} deliveries",
            fields=fields, back=back,
        )  # fmt: skip
    async with request.app[POOL].acquire() as conn:
        n = await actions.replay_deliveries(
            conn, actor(request), destination=destination, since=since, until=until, state=state
        )
    return done(request, "Replayed", [f"replayed {n} {state} deliveries" if n else "nothing to replay"], back)


@guarded
async def senders_resume(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    scope, provider, key = field(form, "scope"), field(form, "provider"), field(form, "key")
    if scope not in ("number", "token") or provider not in ("meta", "tenashi") or key is None:
        raise BadForm("a breaker is a scope (number, token), a provider and a key")
    async with request.app[POOL].acquire() as conn:
        line = await actions.resume_breaker(conn, actor(request), scope, key, provider=provider)
    return done(request, "Resumed", [line], "/senders")
