"""The console: an ASGI application (Starlette) over one store."""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, Final, final

import jinja2
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import Error, ErrorClass
from ..kernel import RUN_STATES, RunRecord
from ._answers import Answerer
from ._guard import AUTH_COOKIE, SESSION_COOKIE, Guard
from ._views import asked, event_view, events_view, run_row, run_view, unreadable_row

__all__ = ["Console"]

_STATES: Final = tuple(sorted(RUN_STATES))
#: a comment line this often keeps an idle event stream (and its proxies) open
_HEARTBEAT: Final = 15.0


@final
class Console:
    """The web console of ``store``, an ASGI application.

    Pages: the runs (filtered by state, newest first, paged), one run
    (transcript, intents, budget, deadline, the pending question, what a
    recovery would find, a timeline), and the run's stored events live
    (server-sent events resuming after ``Last-Event-ID``).  Every page
    needs ``authenticate(request)`` to name someone; by default, the
    console's ``token`` (random unless given; ``/login?token=...`` sets
    it as a cookie).  An answer also needs the page's CSRF token, goes
    to a run still waiting on that question, and through ``answer`` (the
    host holding the run): without one, questions are shown, never
    answered.  Values are escaped; nothing but stored records is read, so
    ``provider_context`` and ``backend_context`` never show.
    """

    def __init__(
        self,
        store: Any,
        *,
        token: str | None = None,
        authenticate: Callable[[Request], str | None] | None = None,
        answer: Answerer | None = None,
        poll_interval: float = 0.5,
        page_size: int = 50,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if token is not None and (type(token) is not str or len(token) < 16):
            raise Error(ErrorClass.VALIDATION, "token must be a str of 16 characters or more")
        if type(page_size) is not int or page_size < 1:
            raise Error(ErrorClass.VALIDATION, "page_size must be a positive int")
        self.store = store
        self.token = token or secrets.token_urlsafe(24)
        self.guard = Guard(self.token, authenticate)
        self.answer = answer
        self.poll_interval = float(poll_interval)
        self.page_size = page_size
        self._now = wall_clock
        loader = jinja2.PackageLoader("trio_backplane.console", "templates")
        self._templates = jinja2.Environment(loader=loader, autoescape=True)
        self._app = Starlette(
            routes=[
                Route("/login", self._login),
                Route("/", self._runs),
                # each resource under its own prefix: a run id may hold "/"
                Route("/events/{run_id:path}", self._events),
                Route("/answer/{run_id:path}", self._answer, methods=["POST"]),
                Route("/runs/{run_id:path}", self._run),
            ]
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)

    def login_path(self) -> str:
        """The path that signs a browser in with the console's token."""
        return "/login?" + urllib.parse.urlencode({"token": self.token})

    # -- pages ------------------------------------------------------------------

    def _page(self, request: Request, name: str, status: int = 200, **values: Any) -> Response:
        session = request.cookies.get(SESSION_COOKIE) or secrets.token_urlsafe(16)
        nonce = secrets.token_urlsafe(12)  # the page's own script runs, no other
        html = self._templates.get_template(name).render(
            csrf=self.guard.csrf(session), answering=self.answer is not None, nonce=nonce, **values
        )
        headers = {**_HEADERS, "Content-Security-Policy": _CSP.format(nonce=nonce)}
        response = HTMLResponse(html, status_code=status, headers=headers)
        if SESSION_COOKIE not in request.cookies:
            response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict")
        return response

    def _refused(self, request: Request) -> Response | None:
        if self.guard.who(request) is None:
            return HTMLResponse(
                "<h1>401</h1><p>Sign in with the console's token: /login?token=...</p>",
                status_code=401,
                headers=_HEADERS,
            )
        return None

    async def _login(self, request: Request) -> Response:
        offered = request.query_params.get("token", "")
        if not self.guard.valid_token(offered):
            return HTMLResponse("<h1>401</h1><p>wrong token</p>", 401, headers=_HEADERS)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(AUTH_COOKIE, offered, httponly=True, samesite="strict")
        return response

    async def _runs(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        state = request.query_params.get("state") or None
        if state is not None and state not in _STATES:
            return self._page(request, "error.html", 400, message=f"no state {state!r}")
        try:
            page = max(1, int(request.query_params.get("page", "1")))
        except ValueError:
            page = 1
        summaries = await self.store.list_runs(states=None if state is None else [state])
        # newest first by admission, from the listing alone: a page reads its own records only
        ordered = sorted(((s.admitted_at or 0.0, s.run_id) for s in summaries), reverse=True)
        start = (page - 1) * self.page_size
        listed = {summary.run_id: summary for summary in summaries}
        rows = []
        for _, run_id in ordered[start : start + self.page_size]:
            try:
                record = await self.store.load(run_id)
            except Error as error:
                if error.details.get("run_id") != run_id:  # the store failed, not this run
                    raise
                rows.append(unreadable_row(listed[run_id], error))
                continue
            if record is not None:
                rows.append(run_row(record))
        pages = max(1, -(-len(ordered) // self.page_size))
        return self._page(
            request, "runs.html", rows=rows, state=state, states=_STATES, page=page, pages=pages,
            total=len(ordered),
        )  # fmt: skip

    async def _record(self, request: Request) -> RunRecord | Response:
        run_id = request.path_params["run_id"]
        try:
            record: RunRecord | None = await self.store.load(run_id)
        except Error as error:
            if error.error_class is ErrorClass.VALIDATION:  # an id no run can have
                record = None
            elif error.details.get("run_id") == run_id:  # damaged, or from a newer version
                why = f"{error.error_class.value}: {error.message}"
                return self._page(request, "error.html", 500, message=f"run {run_id!r}: {why}")
            else:
                raise
        if record is None:
            return self._page(request, "error.html", 404, message=f"no run {run_id!r}")
        return record

    async def _run(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        record = await self._record(request)
        if isinstance(record, Response):
            return record
        events = await self.store.events(record.run_id)
        return self._page(
            request,
            "run.html",
            run=run_view(record, self._now()),
            events=events_view(events),
            after=events[-1].sequence if events else 0,
            notice=request.query_params.get("notice"),
        )

    # -- live events --------------------------------------------------------------

    async def _events(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        record = await self._record(request)
        if isinstance(record, Response):
            return record
        mark = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        try:
            after = min(max(0, int(mark)), _MAX_SEQUENCE)
        except ValueError:
            after = 0
        return _EventStream(self._stream(record.run_id, after))

    async def _stream(self, run_id: str, after: int) -> AsyncGenerator[str, None]:
        """Each stored event after ``after`` as it is committed (``id``: its
        sequence, so a reconnect resumes where it stopped); ``end`` once
        the run is terminal and every event was sent."""
        yield "retry: 1000\n\n"
        quiet_since = trio.current_time()
        while True:
            record = await self.store.load(run_id)
            events = await self.store.events(run_id, after=after)
            for event in events:
                after = event.sequence or after + 1
                data = json.dumps(event_view(event), ensure_ascii=False)
                yield f"id: {after}\nevent: stored\ndata: {data}\n\n"
            if events:
                quiet_since = trio.current_time()
            elif record is None or record.terminal:
                yield "event: end\ndata: {}\n\n"
                return
            elif trio.current_time() - quiet_since >= _HEARTBEAT:
                quiet_since = trio.current_time()
                yield ": still here\n\n"
            await trio.sleep(self.poll_interval)

    # -- answers ----------------------------------------------------------------------

    async def _answer(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        form = await _form(request)
        session = request.cookies.get(SESSION_COOKIE)
        if not self.guard.csrf_ok(session, _field(form, "csrf")):
            return self._page(request, "error.html", 403, message="the form is stale: reload")
        if self.answer is None:
            return self._page(request, "error.html", 403, message="this console answers nothing")
        record = await self._record(request)
        if isinstance(record, Response):
            return record
        interaction_id = _field(form, "interaction_id")
        if asked(record) != interaction_id:
            message = "the run no longer waits on this question"
            return self._page(request, "error.html", 409, message=message)
        answer = "approved" if _field(form, "answer") == "approved" else "denied"
        try:
            await self.answer(record.run_id, interaction_id, answer)
        except Error as error:
            message = f"{error.error_class.value}: {error.message}"
            return self._page(request, "error.html", 409, message=message)
        where = urllib.parse.quote(record.run_id, safe="/")
        return RedirectResponse(f"/runs/{where}?notice={answer}", status_code=303)


class _EventStream(StreamingResponse):
    """A server-sent event stream whose generator is closed however the
    response ends (finished, the client gone, the server stopping), never
    left to the garbage collector."""

    def __init__(self, events: AsyncGenerator[str, None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers=_SSE_HEADERS)
        self._events = events

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async with aclosing(self._events):
            await super().__call__(scope, receive, send)


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first of each; at most
    ``_MAX_FORM`` bytes read): no multipart parser needed."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM:
            return {}
    fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


def _field(form: dict[str, str], name: str) -> str:
    return form.get(name, "")


#: The most of an answer's form read, and the highest sequence resumed from.
_MAX_FORM: Final = 64 * 1024
_MAX_SEQUENCE: Final = 2**62


#: No page may be framed, sniffed, or run a script but its own.
_CSP: Final = (
    "default-src 'self'; script-src 'nonce-{nonce}'; style-src 'self' 'unsafe-inline'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_SSE_HEADERS: Final = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
