"""The Starlette application behind ``agentjournal ui``.

Every page is server-rendered HTML (Jinja2, autoescaped: a run's content is shown,
never executed) and answers as JSON too: a path ending in ``.json``, ``?format=json``
or ``Accept: application/json``. The one script is htmx, vendored in the package, for
the live tail (server-sent events); pages work without it. A strict
Content-Security-Policy allows scripts from the server's own ``/static`` only.

Security: see :func:`create_app` and :class:`Guard`.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import secrets
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ..decisions import OUTCOMES, Outcome, record_approval, record_resolution
from ..errors import JournalError
from ..forks import fork
from ..saga import cancel
from ..store import Store, mask_secrets
from . import views
from .standing import DONE
from .views import NotFound, States

#: How often the live tail looks for new events (a new event shows within this).
TAIL_POLL_S = 0.02
#: A comment line this often keeps an idle event stream open through proxies.
KEEPALIVE_S = 15.0
TOKEN_COOKIE = "agentjournal_token"
#: The query a page is sent back with after a decision: which run, at which seq.
DECIDED_PARAMS = ("decided_run", "decided_seq")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Config:
    """What one server shows and allows."""

    def __init__(self, store: Store, store_url: str, *, writer: Callable[[], Store],
                 allow_decisions: bool, token: str | None, by: str,
                 metrics: Callable[[], bytes] | None, states: States | None) -> None:
        self.store, self.store_url, self.writer = store, store_url, writer
        self.allow_decisions, self.token, self.by = allow_decisions, token, by
        self.metrics = metrics
        self.csrf = secrets.token_urlsafe(32)
        self.states = states or States(store)


def create_app(store: Store, store_url: str, *, allow_decisions: bool = False,
               token: str | None = None, host: str = "127.0.0.1", by: str = "ui",
               writer: Callable[[], Store] | None = None,
               metrics: Callable[[], bytes] | None = None,
               states: States | None = None) -> Starlette:
    """The viewer over ``store`` (opened read-only by the caller, or a writer).

    ``host``: where it will be bound; anything but a loopback address needs ``token``
    (ValueError otherwise), which every request must then carry (``Authorization:
    Bearer``, the cookie a first ``?token=`` visit sets). Decisions (approve, deny,
    resolve, fork, cancel) are refused unless ``allow_decisions``; each POST must carry
    the page's CSRF token. ``writer`` opens the store for a decision (default: ``store``
    itself). ``metrics``: the body of ``/metrics`` (absent: 404). ``states``: what the
    pages keep of each run's log besides its outline (default: a new one)."""
    if not is_loopback(host) and not token:
        raise ValueError(f"binding {host!r} serves other machines: give a token (--token "
                         "or AGENTJOURNAL_UI_TOKEN), or bind 127.0.0.1")
    config = Config(store, store_url, writer=writer or (lambda: store),
                    allow_decisions=allow_decisions, token=token, by=by, metrics=metrics,
                    states=states)
    pages = Pages(config)
    routes = [
        Route("/", pages.queue), Route("/index.json", pages.queue),
        Route("/runs", pages.runs), Route("/runs.json", pages.runs),
        Route("/metrics", pages.metrics),
        Route("/runs/{run_id}", pages.run),
        Route("/runs/{run_id}/events", pages.events),
        Route("/runs/{run_id}/events.json", pages.events),
        Route("/runs/{run_id}/state", pages.state),
        Route("/runs/{run_id}/state.json", pages.state),
        Route("/runs/{run_id}/diff", pages.diff),
        Route("/runs/{run_id}/diff.json", pages.diff),
        Route("/runs/{run_id}/calls/{key}", pages.call),
        Route("/runs/{run_id}/tail", pages.tail),
        Route("/runs/{run_id}/approvals/{approval_id}", pages.decide_approval,
              methods=["POST"]),
        Route("/runs/{run_id}/calls/{key}/resolve", pages.resolve, methods=["POST"]),
        Route("/runs/{run_id}/fork", pages.fork, methods=["POST"]),
        Route("/runs/{run_id}/cancel", pages.cancel, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("agentjournal.ui", "static")]),
              name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={
        NotFound: pages.not_found, 404: pages.not_found, JournalError: pages.journal_error,
        Refused: pages.refused})
    app.add_middleware(Guard, token=token, loopback_only=is_loopback(host) and not token)
    return app


class Guard:
    """Every request: the token when one is set (else the Host must be this machine's
    name, so a web page elsewhere cannot reach the viewer through DNS rebinding), and
    headers that keep a page from running anything but its own scripts."""

    def __init__(self, app: ASGIApp, *, token: str | None, loopback_only: bool) -> None:
        self.app, self.token, self.loopback_only = app, token, loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if self.token and request.query_params.get("token"):
            await self._login(request)(scope, receive, send)
            return

        async def secured(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                headers += [(b"content-security-policy", CSP.encode()),
                            (b"x-content-type-options", b"nosniff"),
                            (b"referrer-policy", b"same-origin"),
                            (b"x-frame-options", b"DENY")]
            await send(message)

        await self.app(scope, receive, secured)

    def _refusal(self, request: Request) -> Response | None:
        if self.loopback_only:
            name = (request.headers.get("host") or "").rsplit(":", 1)[0]
            if name.lower() not in LOOPBACK_NAMES:
                return PlainTextResponse("this viewer answers to localhost only (the Host "
                                         "header names another machine)", 403)
        if self.token and not self._has_token(request):
            return PlainTextResponse("a token is required: open the URL the server printed "
                                     "(?token=...) or send 'Authorization: Bearer TOKEN'",
                                     401)
        return None

    def _has_token(self, request: Request) -> bool:
        assert self.token is not None
        given = [request.cookies.get(TOKEN_COOKIE, ""), request.query_params.get("token", "")]
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given.append(auth[7:].strip())
        return any(g and hmac.compare_digest(g.encode(), self.token.encode()) for g in given)

    def _login(self, request: Request) -> Response:
        """A ``?token=`` visit: keep the token in a cookie, and drop it from the URL."""
        query = {k: v for k, v in parse_qs(request.url.query).items() if k != "token"}
        target = own_path(request.url.path) + (f"?{urlencode(query, doseq=True)}"
                                               if query else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(TOKEN_COOKIE, self.token or "", httponly=True, samesite="strict")
        return response


def own_path(path: str) -> str:
    """``path`` as a path of this viewer: a browser reads ``//host/x`` (and ``/\\host/x``)
    as another site's address, so leading slashes and backslashes fold into one."""
    return "/" + path.lstrip("/\\")


# --- pages -------------------------------------------------------------------------------


def wants_json(request: Request) -> bool:
    return (request.url.path.endswith(".json") or request.query_params.get("format") == "json"
            or "application/json" in request.headers.get("accept", ""))


#: The largest number a page takes (a seq, a page, a limit): far past any run's length,
#: and small enough for every store's integer column and ``islice``.
MAX_NUMBER = 2**53


def _int(request: Request, name: str, default: int, low: int = 0) -> int:
    """The query's ``name`` as a whole number (below ``low``: ``low``); a word or a
    number past MAX_NUMBER is a 400 that says what would do."""
    given = request.query_params.get(name)
    if given is None or given == "":
        return default
    return max(low, _whole(name, given, low, MAX_NUMBER))


def _whole(name: str, given: str, low: int, high: int) -> int:
    """``given`` as a whole number up to ``high``; else a 400 that says what would do
    (below ``low`` is the caller's to clamp or refuse)."""
    try:
        number = int(given)
    except ValueError:
        number = None
    if number is None or number > high:
        raise Refused(400, f"{name}={given[:40]!r}: give a whole number from {low} to "
                      f"{high}")
    return number


def _seconds(text: str | None) -> float | None:
    """``90``, ``15m``, ``2h``, ``3d`` in seconds; None for nothing or nonsense."""
    if not text:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        return None


class Pages:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.env = Environment(loader=PackageLoader("agentjournal.ui", "templates"),
                               autoescape=select_autoescape(default=True))
        self.env.filters["pretty"] = _pretty
        self.env.globals["CUT_AT"] = CUT_AT
        self.env.globals["SHOWN_AT_MOST"] = SHOWN_AT_MOST
        self.env.filters["short"] = _short
        self.env.filters["age"] = _human_age
        self.env.filters["took"] = _took
        for name in self.env.list_templates():  # compiled now, not by the first requests
            self.env.get_template(name)

    @property
    def _store_hint(self) -> str:
        """Appended to a command a page offers to copy (its password hidden)."""
        return f" --store {mask_secrets(self.config.store_url)}"

    # --- rendering

    def render(self, request: Request, template: str, data: dict[str, Any],
               status: int = 200) -> Response:
        if wants_json(request):
            return JSONResponse(json.loads(json.dumps(data, default=str)), status)
        page = self.env.get_template(template).render(
            **data, data=data, store=mask_secrets(self.config.store_url),
            request_query=request.url.query,
            csrf=self.config.csrf, decisions=self.config.allow_decisions, by=self.config.by,
            now=datetime.now(UTC).isoformat(timespec="seconds"))
        return HTMLResponse(page, status)

    def _partial(self, template: str, data: dict[str, Any]) -> str:
        """A piece of a page (the live tail's), with what every page's templates see."""
        return self.env.get_template(template).render(
            **data, csrf=self.config.csrf, decisions=self.config.allow_decisions,
            by=self.config.by)

    async def _call(self, fn: Callable[..., dict[str, Any]], *args: Any,
                    **kwargs: Any) -> dict[str, Any]:
        return await run_in_threadpool(fn, *args, **kwargs)

    # --- reading

    async def queue(self, request: Request) -> Response:
        data = await self._call(views.needs_a_person, self.config.store, self.config.states)
        data["decided"] = await self._decided_note(request)
        return self.render(request, "queue.html", data)

    async def runs(self, request: Request) -> Response:
        q = request.query_params
        data = await self._call(
            views.runs_page, self.config.store, self.config.states,
            status=q.get("status") or None, older_than_s=_seconds(q.get("older_than")),
            newer_than_s=_seconds(q.get("newer_than")), page=_int(request, "page", 1, 1),
            per_page=min(500, _int(request, "per_page", views.PAGE_RUNS, 1)),
            query=q.get("q") or None)
        data["filters"] = {k: q.get(k, "") for k in ("q", "status", "older_than",
                                                     "newer_than")}
        return self.render(request, "runs.html", data)

    def _run_id(self, request: Request) -> tuple[str, bool]:
        """The run id in the path, and whether it asked for JSON by a ``.json`` suffix
        (an id may itself end in ``.json``: a run of that name wins)."""
        run_id: str = request.path_params["run_id"]
        if run_id.endswith(".json") and len(run_id) > 5:
            bare = views.checked_id(run_id[:-5])
            if not self.config.store.last_seq(views.checked_id(run_id)):
                return bare, True
        return views.checked_id(run_id), False

    async def run(self, request: Request) -> Response:
        run_id, as_json = self._run_id(request)
        summary = await self._call(views.run_summary, self.config.store, self.config.states,
                                   run_id, self._store_hint)
        last = summary["events"]
        limit = min(1000, _int(request, "limit", views.PAGE_EVENTS, 1))
        after = _int(request, "after", max(0, last - limit))
        page = await self._call(views.events_page, self.config.store, run_id, after, limit,
                                upto=last)
        # The latest page of a run that may still move streams its new events.
        live = after + limit >= last and summary["status"] not in DONE
        data = {"run": summary, **page, "live": live,
                "decided": await self._decided_note(request)}
        if as_json:
            return JSONResponse(json.loads(json.dumps(data, default=str)))
        return self.render(request, "run.html", data)

    async def events(self, request: Request) -> Response:
        run_id, _ = self._run_id(request)
        limit = min(1000, _int(request, "limit", views.PAGE_EVENTS, 1))
        data = await self._call(views.events_page, self.config.store, run_id,
                                _int(request, "after", 0), limit)
        return self.render(request, "events.html", data)

    async def state(self, request: Request) -> Response:
        run_id, _ = self._run_id(request)
        after = request.query_params.get("after")  # absent: the window's default
        data = await self._call(views.state_at, self.config.store, run_id,
                                _int(request, "seq", 1 << 62, 1),
                                None if not after else _int(request, "after", 0))
        return self.render(request, "state.html", data)

    async def diff(self, request: Request) -> Response:
        run_id, _ = self._run_id(request)
        data = await self._call(views.diff_page, self.config.store, run_id,
                                _int(request, "a", 1, 1), _int(request, "b", 1 << 62, 1))
        return self.render(request, "diff.html", data)

    async def call(self, request: Request) -> Response:
        run_id, _ = self._run_id(request)
        key = request.path_params["key"]
        as_json = key.endswith(".json")
        at = _int(request, "at", 0)
        data = await self._call(views.call_detail, self.config.store, run_id,
                                key.removesuffix(".json"), at or None, self.config.states)
        if as_json:
            return JSONResponse(json.loads(json.dumps(data, default=str)))
        return self.render(request, "call.html", data)

    async def metrics(self, request: Request) -> Response:
        if self.config.metrics is None:
            raise NotFound("/metrics")
        body = await run_in_threadpool(self.config.metrics)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    # --- the live tail

    async def tail(self, request: Request) -> Response:
        run_id, _ = self._run_id(request)
        after = _int(request, "after", 0)
        if not await run_in_threadpool(self.config.store.last_seq, run_id):
            raise NotFound(run_id)
        return StreamingResponse(self._stream(request, run_id, after),
                                 media_type="text/event-stream",
                                 headers={"cache-control": "no-store"})

    async def _stream(self, request: Request, run_id: str, after: int) -> AsyncIterator[str]:
        """New events as rows, each batch with the page's head as of the same seq: the
        state, the counts and the open calls move with the table."""
        idle = 0.0
        store = self.config.store
        while not await request.is_disconnected():
            if await run_in_threadpool(store.last_seq, run_id) > after:
                run = await self._call(views.run_summary, store, self.config.states, run_id,
                                      self._store_hint)
                rows = await run_in_threadpool(views.tail_rows, store, run_id, after,
                                               run["events"])
                yield _sse("head", self._partial("run_head.html", {"run": run}))
                yield _sse("event", self._partial("rows.html", {"events": rows,
                                                                "run_id": run_id}))
                after = run["events"]
                yield _sse("seq", str(after))  # the seq the page is now as of
                idle = 0.0
            else:
                await asyncio.sleep(TAIL_POLL_S)
                idle += TAIL_POLL_S
                if idle >= KEEPALIVE_S:
                    yield ": keepalive\n\n"
                    idle = 0.0

    # --- decisions

    async def _form(self, request: Request) -> dict[str, str]:
        """The POST's form, once its CSRF token and the server's flag allow a decision."""
        if not self.config.allow_decisions:
            raise Refused(403, "decisions are off: start the viewer with --allow-decisions "
                          "to record them here (or use the CLI)")
        form = {k: str(v) for k, v in (await request.form()).items()}
        given = form.get("csrf", "") or request.headers.get("x-csrf-token", "")
        if not hmac.compare_digest(given.encode(), self.config.csrf.encode()):
            raise Refused(403, "the form's CSRF token is missing or stale: reload the page "
                          "and submit it again")
        origin = request.headers.get("origin")
        if origin and origin.split("://", 1)[-1] != request.headers.get("host"):
            raise Refused(403, f"a form from another origin ({origin}) is refused")
        return form

    def _by(self, form: dict[str, str]) -> str:
        return (form.get("by") or "").strip() or self.config.by

    def _decided(self, request: Request, run_id: str, events: list[Any],
                 appended: bool, form: dict[str, str]) -> Response:
        if wants_json(request):
            return JSONResponse({"run_id": run_id, "appended": appended,
                                 "events": json.loads(json.dumps(views.as_json(events),
                                                                 default=str))})
        # Back where the form was, saying there what was recorded and what comes next.
        back = urlsplit(self._back(request, form) or f"/runs/{run_id}")
        query = [(k, v) for k, v in parse_qsl(back.query) if k not in DECIDED_PARAMS]
        query += [("decided_run", run_id), ("decided_seq", str(events[0].seq))] if events else []
        return RedirectResponse(back.path + (f"?{urlencode(query)}" if query else ""),
                                status_code=303)

    async def _decided_note(self, request: Request) -> dict[str, Any] | None:
        """The note a page shows after a decision redirected to it (see _decided)."""
        run_id, seq = (request.query_params.get(k) for k in DECIDED_PARAMS)
        if not run_id or not seq or not seq.isdigit() or len(seq) > 15:
            return None
        try:
            return await run_in_threadpool(views.decision_note, self.config.store,
                                           self.config.states, run_id, int(seq),
                                           self._store_hint)
        except NotFound:
            return None

    @staticmethod
    def _back(request: Request, form: dict[str, str] | None = None) -> str | None:
        """The page the form was on, when it is a page of this viewer: the confirmation
        page's ``back`` field, else the Referer (one naming another site is not
        followed)."""
        if form and form.get("back", "").startswith("/"):
            back = urlsplit(own_path(form["back"]))
            return back.path + (f"?{back.query}" if back.query else "")
        referer = urlsplit(request.headers.get("referer") or "")
        if referer.netloc != request.headers.get("host") or not referer.path:
            return None
        return own_path(referer.path) + (f"?{referer.query}" if referer.query else "")

    async def _confirmation(self, request: Request, form: dict[str, str], run_id: str,
                            ask: dict[str, Any] | None) -> Response | None:
        """The page asking to confirm a decision (``ask``: what it decides), unless it
        was confirmed, asked for as JSON (a script), or needs no confirmation (None)."""
        if ask is None or form.get("confirm") == "yes" or wants_json(request):
            return None
        typed = {k: v for k, v in form.items() if k not in ("csrf", "confirm", "back")}
        back = self._back(request, form) or f"/runs/{run_id}"
        return self.render(request, "confirm.html", {"confirm": {
            **ask, "run_id": run_id, "typed": typed, "back": back,
            "action": request.url.path}})

    async def decide_approval(self, request: Request) -> Response:
        try:
            form = await self._form(request)
        except Refused as refused:
            return refused.response()
        run_id, _ = self._run_id(request)
        approved = form.get("decision") == "approve"
        if not approved and form.get("decision") != "deny":
            return Refused(400, "decision must be approve or deny").response()
        approval_id = request.path_params["approval_id"]
        if approved:
            ask = await run_in_threadpool(views.approval_to_confirm, self.config.store,
                                          self.config.states, run_id, approval_id)
            if (page := await self._confirmation(request, form, run_id, ask)) is not None:
                return page
        decision = await run_in_threadpool(
            self._write, record_approval, run_id, approval_id,
            approved=approved, by=self._by(form), reason=form.get("reason", ""))
        return self._decided(request, run_id, decision.events, decision.appended, form)

    async def resolve(self, request: Request) -> Response:
        try:
            form = await self._form(request)
        except Refused as refused:
            return refused.response()
        run_id, _ = self._run_id(request)
        outcome = form.get("outcome", "")
        if outcome not in OUTCOMES.values():
            return Refused(400, "outcome must be happened, did_not_happen or "
                                "conflict").response()
        try:
            result = json.loads(form["result"]) if form.get("result") else None
        except ValueError as exc:
            message = (f"the result is not JSON ({exc}): write it as JSON, e.g. "
                       '{"id": 7}, "text" or 42; or leave it empty')
            if wants_json(request):
                return Refused(400, message).response()
            return await self._form_again(request, run_id, {
                "run_id": run_id, "key": request.path_params["key"], "message": message,
                "typed": {k: form.get(k, "") for k in ("by", "reason", "result")}})
        chosen: Outcome = outcome  # type: ignore[assignment]
        ask = await run_in_threadpool(views.verdict_to_confirm, self.config.store,
                                      self.config.states, run_id, request.path_params["key"],
                                      chosen)
        if (page := await self._confirmation(request, form, run_id, ask)) is not None:
            return page
        decision = await run_in_threadpool(
            self._write, record_resolution, run_id, request.path_params["key"],
            outcome=chosen, by=self._by(form), reason=form.get("reason", ""), result=result)
        return self._decided(request, run_id, decision.events, decision.appended, form)

    async def _form_again(self, request: Request, run_id: str,
                          error: dict[str, Any]) -> Response:
        """The page the form was on (the queue, else the run's), as a 400 with the
        error beside the field and what was typed kept."""
        if (self._back(request) or "").split("?")[0] == "/":
            data = await self._call(views.needs_a_person, self.config.store,
                                    self.config.states)
            return self.render(request, "queue.html", {**data, "form_error": error}, 400)
        summary = await self._call(views.run_summary, self.config.store, self.config.states,
                                   run_id, self._store_hint)
        last = summary["events"]
        page = await self._call(views.events_page, self.config.store, run_id,
                                max(0, last - views.PAGE_EVENTS), views.PAGE_EVENTS, upto=last)
        return self.render(request, "run.html", {"run": summary, **page, "live": False,
                                                 "form_error": error}, 400)

    async def fork(self, request: Request) -> Response:
        try:
            form = await self._form(request)
        except Refused as refused:
            return refused.response()
        run_id, _ = self._run_id(request)
        last = await run_in_threadpool(self.config.store.last_seq, run_id)
        if not last:
            raise NotFound(run_id)
        at = _whole("seq", form.get("seq", ""), 1, last)
        if at < 1:
            raise Refused(400, f"seq={at}: give a whole number from 1 to {last}")
        new_id = await run_in_threadpool(self._write, fork, run_id, at,
                                         form.get("new_run_id") or None)
        if wants_json(request):
            return JSONResponse({"run_id": new_id, "origin": run_id, "at_seq": at})
        return RedirectResponse(f"/runs/{new_id}", status_code=303)

    async def cancel(self, request: Request) -> Response:
        try:
            form = await self._form(request)
        except Refused as refused:
            return refused.response()
        run_id, _ = self._run_id(request)
        await run_in_threadpool(self._write, cancel, run_id, by=self._by(form),
                                reason=form.get("reason", ""))
        if wants_json(request):
            return JSONResponse({"run_id": run_id, "cancelled": True})
        return RedirectResponse(f"/runs/{run_id}", status_code=303)

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.config.writer(), *args, **kwargs)

    # --- errors

    async def not_found(self, request: Request, exc: Exception) -> Response:
        data = {"error": "not found", "detail": "no such run or page"}
        return self.render(request, "error.html", data, 404)

    async def refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        return exc.response()

    async def journal_error(self, request: Request, exc: Exception) -> Response:
        data = {"error": type(exc).__name__, "detail": mask_secrets(str(exc))}
        return self.render(request, "error.html", data, 409)


class Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail

    def response(self) -> Response:
        return JSONResponse({"error": "refused", "detail": self.detail}, self.status)


def _sse(event: str, data: str) -> str:
    lines = "".join(f"data: {line}\n" for line in data.splitlines() or [""])
    return f"event: {event}\n{lines}\n"


#: A value longer than this (as indented JSON) is cut on a page, with a link to the whole
#: of it: a 40 MB tool result must not make a 40 MB page.
CUT_AT = 20_000


#: Rows of calls or messages a page shows (the newest); the JSON twin has them all.
SHOWN_AT_MOST = 200


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


def _short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str,
                                                           ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _took(seconds: float | None) -> str:
    """A duration for a reader: ms under a second, then s, min, h."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.1f} s"
    return _human_age(seconds)


def _human_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


__all__ = ["create_app", "is_loopback"]
