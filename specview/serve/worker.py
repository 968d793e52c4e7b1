"""The one engine thread of `specview serve`: requests run one after another, in arrival order, from a
bounded queue, on the session loaded at start (docs/design/serve.md).

Each request is a Job. The engine thread sends its records (start, one per step, end; or one error) to
the job's asyncio queue and to the /events fan-out in ONE call_soon_threadsafe callback: the fan-out numbers
the record and the job gets (that number, record), so a client whose /generate stream drops can pick
up on /events after the last number it saw. Between two steps it looks at two flags: the job's
`cancelled` (its client went away) and the server's Stop (SIGINT/SIGTERM: stopping.py). On a stop the
request in flight ends after its step (stop_reason "interrupted"), the waiting ones are answered 503,
and the session's profile (the newest --profile-max-steps steps of all requests) is written.

A request is checked whole on arrival (submit(), on the loop's thread), before it queues: its settings,
its prompt's tokens (with the loop thread's own copy of the tokenizer: a Rust tokenizer refuses use from
two threads at once) against the context, and a chat template if it asks for one. What the engine thread
takes from the queue can run."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import math
import queue
import threading
import time
import traceback
from collections import deque

import torch

from specview.backend.views import StepView, step_record
from specview.core.detokenize import token_texts
from specview.core.errors import SpecviewError
from specview.core.stopping import Stop
from specview.engine.drafter import context_holders
from specview.profiling.recorder import ProfileRecorder
from specview.serve.event_fanout import EventFanout
from specview.serve.metrics import ServeMetrics
from specview.serve.schema import ApiError
from specview.session import Session, check_context, encode_prompt, start_event

SHUTTING_DOWN = "the server is shutting down"


class Job:
    """One request: what it asked for, where its records go, and its cancel flag."""

    def __init__(self, ident: int, request, loop: asyncio.AbstractEventLoop, settings=None, draft: str | None = None,
                 prompt_ids: list[int] | None = None):
        self.id = ident
        self.request = request
        self.settings, self.draft, self.prompt_ids = settings, draft, prompt_ids  # resolved and checked on arrival
        self.loop = loop
        self.records: asyncio.Queue = asyncio.Queue()  # made on the loop's thread, read there
        self.cancelled = threading.Event()
        self.queued_at = time.perf_counter()
        self.sequence_text: str | None = None  # prompt + output decoded as one (set before the end record)

    def cancel(self) -> None:
        self.cancelled.set()


def error_record(err: ApiError) -> dict:
    return {"type": "error", "status": err.status, "error": err.error, "field": err.field}


class EngineWorker:
    def __init__(self, session: Session, metrics: ServeMetrics, fanout: EventFanout, *, queue_size: int, cap: int,
                 profile_dir: str, stop: Stop | None = None, profile_max_steps: int | None = None):
        self.session = session
        self.metrics = metrics
        self.fanout = fanout
        self.queue_size = queue_size
        self.cap = cap
        self.stop = stop or Stop()
        self.jobs: queue.Queue = queue.Queue()  # bounded by submit(): the sentinel of a stop always fits
        self.ids = itertools.count()
        self.recorder = ProfileRecorder(session, "speculative", profile_dir, max_steps=profile_max_steps)
        self.tokenizer = copy.deepcopy(session.target.tokenizer)  # the loop thread's own (submit())
        self.decoders: dict[str, object] = {}  # drafter spec (or "autoregressive") -> its Decoder
        self.drafters = {d.spec: d for d in session.drafters}
        # No seed in a request: draws continue on this generator, seeded once (runs follow each other).
        self.generator = torch.Generator(device=session.device).manual_seed(session.settings.seed)
        self.summaries: deque = deque()  # the runs that still have steps in the profile (its prefills, stop reasons)
        self.running: Job | None = None
        self.mean_latency_s = 0.0
        self.served = 0  # requests run to their end
        self.profile_path: str | None = None
        self.profile_error: str | None = None
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="specview-engine", daemon=True)

    # the loop's side ------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def submit(self, request, loop: asyncio.AbstractEventLoop) -> Job:
        """Queue a request (called on the event loop's thread only) -> its Job, or ApiError 400/503."""
        if request.method == "speculative" and request.draft is not None and request.draft not in self.drafters:
            raise ApiError(400, f"draft: {request.draft!r} is not loaded here; one of: {', '.join(self.drafters)}",
                           "draft")
        if request.method == "speculative" and not self.drafters:
            raise ApiError(400, "this server loaded no drafter: use method autoregressive", "method")
        settings, draft = self._settings(request)
        prompt_ids = self._admit(settings, draft)  # 422 now, not when its turn comes
        if self.stop:
            raise ApiError(503, SHUTTING_DOWN)
        waiting = self.jobs.qsize()
        if waiting >= self.queue_size:
            # A guess at when a place frees up: the requests ahead, at the mean time of one.
            retry = max(1, math.ceil(self.mean_latency_s * (waiting + 1) / 2))
            raise ApiError(503, f"the queue is full ({waiting} waiting); retry later", headers={"Retry-After": str(retry)})
        job = Job(next(self.ids), request, loop, settings, draft, prompt_ids)
        self.jobs.put(job)
        self.metrics.waiting.set(self.jobs.qsize())
        return job

    def _admit(self, settings, draft: str | None) -> list[int]:
        """The request's prompt ids, or ApiError 422 naming the field: no chat template, an empty prompt with no
        BOS to start from, prompt + N past the context of the target or of the request's draft model."""
        try:
            prompt_ids = encode_prompt(self.tokenizer, settings.prompt, settings.chat)
        except SpecviewError as err:
            raise ApiError(422, str(err).replace("--chat", "chat").replace("give --prompt", "give a prompt"),
                           "chat" if settings.chat else "prompt") from None
        models = context_holders(self.session.target, [self.drafters[draft]] if draft else [])
        try:
            check_context(models, len(prompt_ids), settings.max_new_tokens)
        except SpecviewError as err:
            raise ApiError(422, str(err).replace("-N", "max_new_tokens"), _context_field(models, len(prompt_ids))) from None
        return prompt_ids

    def request_stop(self, reason: str = "requested") -> None:
        """Stop after the step in flight (any thread; a signal handler calls it through the loop)."""
        self.stop.request(reason)
        self.jobs.put(None)  # wakes the engine thread if it waits for work

    @property
    def waiting(self) -> int:
        """Requests queued that will run (a cancelled one stays in the queue until the engine skips it)."""
        return sum(1 for job in list(self.jobs.queue) if job is not None and not job.cancelled.is_set())

    def _deliver(self, job: Job, record: dict, publish: bool) -> None:
        """On the loop's thread: number the record in the fan-out (watchers get it) and hand it to the job."""
        event_id = self.fanout.publish(record) if publish else None
        job.records.put_nowait((event_id, record))

    # the engine thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self.stop:
                job = self.jobs.get()
                self.metrics.waiting.set(self.waiting)
                if job is None:
                    continue
                self._serve(job)
        finally:
            self._drain()
            self._save_profile()
            self.finished.set()

    def _send(self, job: Job, record: dict, publish: bool = True) -> None:
        try:
            job.loop.call_soon_threadsafe(self._deliver, job, record, publish)
        except RuntimeError:  # the loop has closed: nobody is waiting for this
            pass

    def _drain(self) -> None:
        """Stopping: every request still waiting gets 503."""
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self._send(job, error_record(ApiError(503, SHUTTING_DOWN)), publish=False)
        self.metrics.waiting.set(0)

    def _save_profile(self) -> None:
        cut = any(summary.stop_reason == "interrupted" for summary in self.summaries)
        try:
            self.profile_path = self.recorder.save(self.summaries, interrupted=cut)
        except SpecviewError as err:
            self.profile_error = str(err)

    def _serve(self, job: Job) -> None:
        if job.cancelled.is_set():  # its client left while it waited
            return
        self.running = job
        self.metrics.running.set(1)
        try:
            self._run(job)
        except Exception as err:  # noqa: BLE001 - one failed request must not end the server
            self.metrics.requests.labels("error").inc()
            traceback.print_exc()  # for the operator; the client learns only that it is the server's fault
            record = {"type": "error", "status": 500, "error": f"internal error ({type(err).__name__}): see the "
                      "server's log", "field": None, "request": job.id}
            self._send(job, record)
        finally:
            self.running = None
            self.metrics.running.set(0)

    def _settings(self, r):
        """The request's settings: the server's, with what the request gives (and N within the cap)."""
        s = self.session.settings
        given = {name: getattr(r, name) for name in ("k", "temperature", "top_k", "top_p", "seed", "chat",
                                                     "ignore_eos", "max_new_tokens") if getattr(r, name) is not None}
        given.setdefault("max_new_tokens", min(s.max_new_tokens, self.cap))
        draft = (r.draft or next(iter(self.drafters), None)) if r.method == "speculative" else None
        return dataclasses.replace(s, prompt=r.prompt, draft=draft or s.draft, **given), draft

    def _decoder(self, draft: str | None):
        key = draft or "autoregressive"
        if key not in self.decoders:
            method = "speculative" if draft else "autoregressive"
            decoder = self.session.decoder(method, timer=self.recorder.timer,
                                           drafter=self.drafters[draft] if draft else None)
            self.recorder.attach(decoder)
            self.decoders[key] = decoder
        return self.decoders[key]

    def _run(self, job: Job) -> None:
        session, r = self.session, job.request
        settings, draft, prompt_ids = job.settings, job.draft, job.prompt_ids
        tokenizer = session.target.tokenizer
        decoder = self._decoder(draft)
        # One decoder per drafter; sampling, K, EOS and the random stream are this request's run's own.
        generator = self.generator if r.seed is None else torch.Generator(device=session.device).manual_seed(r.seed)
        run = decoder.start(prompt_ids, settings.max_new_tokens, k=settings.k, sampling=settings.sampling,
                            ignore_eos=settings.ignore_eos, generator=generator, index=job.id)
        start = start_event(session, decoder.method, 1, settings, prompt_ids)
        start.update(drafter=draft, request=job.id)
        self._send(job, start)
        self.metrics.prompt_tokens.inc(len(prompt_ids))
        several = len(self.drafters) > 1
        decode = tokenizer.decode
        while not run.done and not self.stop and not job.cancelled.is_set():  # the step boundary
            before = run.tokens[-8:]
            step = run.step()
            if several and draft:
                step.drafter = draft  # step records name their drafter when a session has several
            self.recorder.add_step(step)
            self.metrics.step(step)
            record = step_record(StepView(step, token_texts(decode, before, step), run.summary.prefill_ms))
            record["request"] = job.id
            self._send(job, record)
        if not run.done:
            run.summary.stop_reason = "cancelled" if job.cancelled.is_set() else "interrupted"
        run.summary.text = decode(run.generated)
        self.summaries.append(run.summary)
        records = self.recorder.records
        while self.recorder.dropped and self.summaries and records and self.summaries[0].run < records[0].step["run"]:
            self.summaries.popleft()  # none of its steps is left in the profile: let its summary go too
        self.served += 1
        latency = time.perf_counter() - job.queued_at
        self.mean_latency_s += (latency - self.mean_latency_s) / self.served
        self.metrics.finished(run.summary.stop_reason, latency)
        end = run.summary.to_json()
        end["request"] = job.id
        job.sequence_text = decode(run.tokens)  # read by the loop once `end` arrives there
        self._send(job, end)


def _context_field(models, prompt_len: int) -> str:
    """The field to change when prompt + N is past the context: the prompt once it leaves no room at all."""
    try:
        check_context(models, prompt_len, 1)
    except SpecviewError:
        return "prompt"
    return "max_new_tokens"
