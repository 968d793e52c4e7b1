"""The engine in this process behind the Backend interface: specview.session loads the pair, a
ProfileRecorder (specview.profiling) records every step. The engine stream (backend/engine_stream.py) runs it in the TUI's
child process; tests drive it directly."""

from __future__ import annotations

import time

from specview.backend.base import Backend
from specview.backend.views import RunInfo, SessionInfo, StepView
from specview.core.detokenize import CONTEXT, piece_in_context, token_texts
from specview.core.events import RunSummary


class EngineBackend(Backend):
    """The real engine: specview.session + a ProfileRecorder from specview.profiling."""

    def __init__(self, settings):
        super().__init__(settings.target, settings.draft, settings.k, settings.temperature)
        self.settings = settings
        self.session = None
        self.decoder = None
        self.recorder = None
        self.run = None
        self.runs: list = []

    def load(self, on_progress):
        from specview.profiling.recorder import ProfileRecorder
        from specview.profiling.target_token_time import time_target_token
        from specview.session import open_session

        t0 = time.perf_counter()
        session = open_session(self.settings, on_progress, background=True)
        recorder = ProfileRecorder(session, "speculative", self.settings.profile_dir)
        decoder = session.decoder("speculative", timer=recorder.timer)
        on_progress("timing one-token target forwards")
        t_ar_ms = time_target_token(decoder, session.prompt_ids)
        recorder.meta["t_ar_ms"] = t_ar_ms  # the profile's c and v use the same t_ar as the screen
        recorder.attach(decoder)
        with self.lock:
            self.session, self.decoder, self.recorder = session, decoder, recorder
        tok = session.target.tokenizer
        ids = session.prompt_ids
        self.draft = session.drafters[0].spec
        info = SessionInfo(
            target=session.target.spec, draft=self.draft, device=str(session.device),
            temperature=self.settings.temperature, max_new_tokens=self.settings.max_new_tokens,
            prompt_text=tok.decode(ids), t_ar_ms=t_ar_ms, load_s=time.perf_counter() - t0,
            drafters=[d.spec for d in session.drafters],
            prompt_pieces=[piece_in_context(tok.decode, ids[max(0, i - CONTEXT): i], ids[i]) for i in range(len(ids))],
            roofline=recorder.meta.get("roofline"),
            forwards=dict(session.forwards),
        )
        return info, self.new_run()

    def next_drafter(self) -> str:
        with self.lock:  # between steps: each drafter keeps its own state in the run
            drafters = self.session.drafters
            self.decoder.drafter = drafters[(drafters.index(self.decoder.drafter) + 1) % len(drafters)]
            self.recorder.attach(self.decoder)  # norm hooks on a draft model met for the first time
            self.draft = self.decoder.drafter.spec
            return self.draft

    def new_run(self) -> RunInfo:
        with self.lock:
            if self.run is not None and not self.run.done:
                self.run.summary.stop_reason = "interrupted"
            self.run = self.decoder.start(self.session.prompt_ids, self.settings.max_new_tokens, k=self.k)
            self.runs.append(self.run)
            return RunInfo(len(self.runs) - 1)

    @property
    def done(self) -> bool:
        return self.run is None or self.run.done

    @property
    def steps_done(self) -> int:
        return self.run.summary.steps if self.run is not None else 0

    def step(self) -> StepView:
        with self.lock:
            run = self.run
            before = run.tokens[-8:]
            step = run.step(k=self.k)  # K as the viewer has it now (+/- between steps)
            if len(self.session.drafters) > 1:
                step.drafter = self.draft  # docs/design/events.md: step records name their drafter when a session has several
            self.recorder.add_step(step)
            texts = token_texts(self.session.target.tokenizer.decode, before, step)
            return StepView(step, texts, run.summary.prefill_ms)

    def _whatif(self) -> dict | None:
        """Record the current run's distributions now (one target forward over its text, one-token draft
        forwards) and replay them: every drafter of the session, fixed and heuristic, WHATIF_KS."""
        from specview.analysis.whatif import plain, whatif_document
        from specview.profiling.dists import run_dists

        run = self.run
        if run is None or not run.generated or self.session is None:
            return None
        steps = [r for r in self.recorder.steps if r.get("run") == len(self.runs) - 1]
        s = self.settings
        dists = {"greedy": s.sampling.greedy, "max_new_tokens": s.max_new_tokens,
                 "runs": [run_dists(self.session, list(self.session.prompt_ids), list(run.generated), steps)]}
        profile = self.recorder.profile(self.summaries)
        policies = ["fixed", "heuristic"] + (["goodput"] if s.sampling.greedy else [])
        return plain(whatif_document(profile, dists, list(self.WHATIF_KS), policies,
                                     [d.spec for d in self.session.drafters]))

    @property
    def summaries(self) -> list[RunSummary]:
        return [r.summary for r in self.runs]

    def _save(self, final: bool) -> str | None:
        if self.recorder is None:
            return None
        decode = self.session.target.tokenizer.decode
        for r in self.runs:
            r.summary.text = decode(r.generated)
        interrupted = final and self.run is not None and not self.run.done
        if interrupted:
            self.run.summary.stop_reason = "interrupted"
        return str(self.recorder.save(self.summaries, interrupted=interrupted))
