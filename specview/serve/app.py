"""The ASGI app of `specview serve` (Starlette; streams by sse-starlette). docs/design/serve.md:

    POST /generate   {prompt, max_new_tokens?, k?, temperature?, top_k?, top_p?, seed?, method?, draft?,
                      chat?, ignore_eos?, stream?} -> {text, generated_ids, summary, request}
                     stream: text/event-stream, one specview.events/1 record per event (start, step..., end)
    POST /predict    {prompt} -> {text, generated_text, summary}   (the seed project's server)
    GET  /health     {status, loading, error, target, drafters, queue, ...}   (never needs the token): 200 only when
                     requests will be served (status ok); 503 with the same JSON while loading (Retry-After), after
                     a failed load and while stopping, as llama-server answers 503 until its model has loaded
    GET  /live       the same JSON, 200 whenever the process answers at all (a liveness probe; never the token)
    GET  /metrics    Prometheus text (metrics.py)
    GET  /events     text/event-stream of every record of every request, `id:` for Last-Event-ID
    GET  /openapi.json  this API as OpenAPI 3.1, from the request models (openapi.py)

Errors are JSON {"error": "...", "field": ...}: 401 token, 413 body size, 422 malformed (field named; also
prompt + N past the context and chat without a template, on arrival), 400 unknown draft, 503 queue full
(Retry-After), the models still loading (Retry-After; loading.py), their load failed, or shutting down;
404/405 for other paths and methods; a bug is 500 in the same shape. A request can name no model or path. The body is read as JSON whatever its Content-Type (`curl -d` sends
application/x-www-form-urlencoded).

A client that leaves cancels its request, streamed or not, waiting or running: the engine thread skips it,
or ends it at its next step boundary (stop_reason "cancelled"). The request's body has been read when it is
queued, so the next ASGI message is the disconnect: one task waits for it, no polling."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import TYPE_CHECKING

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specview.core.prompt_text import ascii_int
from specview.core.stopping import Stop
from specview.serve.event_fanout import EventFanout
from specview.serve.loading import LOADING_RETRY_S, Readiness
from specview.serve.metrics import CONTENT_TYPE, ServeMetrics
from specview.serve.openapi import openapi_document
from specview.serve.schema import ApiError, GenerateRequest, PredictRequest, parse_body

if TYPE_CHECKING:  # the worker imports torch; the app answers before torch is imported (loading.py)
    from specview.serve.worker import Job

PING_S = 15  # SSE comment lines keep idle streams alive through proxies
CLIENT_GONE = 499  # nginx's "client closed request": the answer nobody reads, for the access log


LOG = logging.getLogger("specview.serve")


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its job is cancelled."""


class BugsAreAnswers:
    """A bug in a handler becomes a JSON 500 and the connection stays open for the client's next request.

    Starlette's own catch-all (ServerErrorMiddleware) answers and then re-raises, and uvicorn closes the
    connection of a request that raised: a client reusing its pooled connection then met a reset, by chance.
    This sits inside that catch-all and does not re-raise. A stream that broke after its head was sent is the
    exception: only a closed connection tells its client, so it still raises."""

    def __init__(self, app, answer):
        self.app, self.answer = app, answer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as err:
            if started:
                raise
            LOG.exception("a bug answered as 500: %s %s", scope.get("method"), scope.get("path"))
            await self.answer(err)(scope, receive, send)


def last_event_id(header: str) -> int | None:
    """A Last-Event-ID header -> the id to replay after, or None (from now on) when it is not a record number.
    Past 19 digits it is after every id this server can have given, so nothing is replayed either way."""
    return ascii_int(header, 19)


async def until_disconnected(request: Request) -> None:
    """Return once the client has gone. Call it only once the body is read: what comes next is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, job: Job, work):
    """Await `work` (a coroutine); if the client disconnects first, cancel the job and raise ClientGone."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()  # (an event stream's own disconnect listener takes over from here)
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    job.cancel()  # waiting: the engine thread skips it; running: it ends at its next step boundary
    raise ClientGone


def create_app(state: Readiness, fanout: EventFanout, metrics: ServeMetrics, stop: Stop, *, cap: int,
               token: str | None = None, max_body: int = 65536) -> Starlette:

    def check_token(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise ApiError(401, "missing or wrong token: send `Authorization: Bearer TOKEN`",
                           headers={"WWW-Authenticate": "Bearer"})

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isascii() and declared.isdigit() and int(declared) > max_body:
            raise ApiError(413, f"the body is larger than {max_body} bytes (--max-body)")
        body = bytearray()
        async for chunk in request.stream():  # a chunked body declares no length: count it
            body += chunk
            if len(body) > max_body:
                raise ApiError(413, f"the body is larger than {max_body} bytes (--max-body)")
        return bytes(body)

    async def submit(request: Request, model) -> tuple[Job, dict]:
        check_token(request)
        worker = state.engine()  # 503 while the models load, or after their load failed
        body = parse_body(await read_body(request), model, cap)
        if isinstance(body, PredictRequest):
            body = GenerateRequest(prompt=body.prompt)
        job = worker.submit(body, asyncio.get_running_loop())
        # its start record, or the 503 that kept it from starting (the server stopped while it waited)
        first = await unless_client_leaves(request, job, job.records.get())
        if first[1]["type"] == "error":
            raise ApiError(first[1]["status"], first[1]["error"], first[1].get("field"))
        return job, first

    async def collect(job: Job, first: tuple) -> dict:
        record = first[1]
        while record["type"] not in ("end", "error"):
            _, record = await job.records.get()
        if record["type"] == "error":
            raise ApiError(record["status"], record["error"], record.get("field"))
        return record

    async def generate(request: Request) -> Response:
        job, first = await submit(request, GenerateRequest)
        if job.request.stream:
            return EventSourceResponse(stream(job, first), ping=PING_S)
        end = await unless_client_leaves(request, job, collect(job, first))
        return JSONResponse({"text": end["text"], "generated_ids": end["generated_ids"], "summary": end,
                             "request": job.id})

    async def stream(job: Job, item: tuple):
        finished = False
        try:
            while True:
                event_id, record = item
                # the id is the record's number on /events: a client cut off resumes there (Last-Event-ID)
                yield {"data": json.dumps(record, allow_nan=False), "id": None if event_id is None else str(event_id)}
                if record["type"] in ("end", "error"):
                    finished = True
                    return
                item = await job.records.get()
        finally:
            if not finished:  # the client went away (sse-starlette cancels us): stop at the next step
                job.cancel()

    async def predict(request: Request) -> Response:
        job, first = await submit(request, PredictRequest)
        end = await unless_client_leaves(request, job, collect(job, first))
        # The seed's server answered the decoded sequence, prompt included.
        return JSONResponse({"text": job.sequence_text, "generated_text": end["text"], "summary": end})

    def health_body() -> dict:
        from specview.session import builds_in_flight

        # forwards_building: spec -> what its background build is doing
        return {**state.health(bool(stop)), "forwards_building": builds_in_flight()}

    async def health(request: Request) -> Response:
        # readiness: a load balancer or a readiness probe takes 200 for "send requests here"
        body = health_body()
        if body["status"] == "ok":
            return JSONResponse(body)
        headers = {"Retry-After": str(LOADING_RETRY_S)} if body["status"] == "loading" else None
        return JSONResponse(body, status_code=503, headers=headers)

    async def live(request: Request) -> Response:
        return JSONResponse(health_body())

    async def metrics_page(request: Request) -> Response:
        check_token(request)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def events(request: Request) -> Response:
        check_token(request)
        watcher = fanout.subscribe(last_event_id(request.headers.get("last-event-id", "")))

        async def records():
            try:
                while (item := await watcher.get()) is not None:
                    yield {"id": str(item[0]), "data": json.dumps(item[1], allow_nan=False)}
            finally:
                fanout.unsubscribe(watcher)

        return EventSourceResponse(records(), ping=PING_S)

    async def openapi(request: Request) -> Response:
        check_token(request)
        return JSONResponse(openapi_document(cap, state.drafters, token is not None))

    def error_response(status: int, body: dict, headers: dict | None = None) -> Response:
        # ASCII JSON: an error may quote what the client sent, and a lone surrogate has no UTF-8 form
        return Response(json.dumps(body), status_code=status, headers=headers, media_type="application/json")

    async def api_error(request: Request, err: ApiError) -> Response:
        metrics.rejected.labels(str(err.status)).inc()
        return error_response(err.status, err.body(), err.headers)

    async def client_gone(request: Request, err: ClientGone) -> Response:
        return Response(status_code=CLIENT_GONE)

    async def http_error(request: Request, err: HTTPException) -> Response:
        return error_response(err.status_code, {"error": err.detail, "field": None}, err.headers)

    def internal_error(err: Exception) -> Response:
        # A bug, not the client's fault: still the error shape (not Starlette's plain text); the fuzz tests fail on it
        metrics.rejected.labels("500").inc()
        return error_response(500, {"error": f"internal error: {type(err).__name__}", "field": None})

    routes = [
        Route("/generate", generate, methods=["POST"]),
        Route("/predict", predict, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/live", live, methods=["GET"]),
        Route("/metrics", metrics_page, methods=["GET"]),
        Route("/events", events, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(BugsAreAnswers, answer=internal_error)],
                     exception_handlers={ApiError: api_error, ClientGone: client_gone, HTTPException: http_error})
