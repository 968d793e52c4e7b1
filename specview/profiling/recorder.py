"""ProfileRecorder: what `run --profile`, bench and the TUI use to write a profile.

    recorder = ProfileRecorder(session, method, "profiles")    # + profile_ops=True, py_spy=True
    decoder = session.decoder(method, timer=recorder.timer)
    recorder.attach(decoder)          # norm hooks on both models; wires recorder.timer into the decoder
    ...
    step = run.step()
    recorder.add_step(step)           # right after step(): fills step.layernorm_ms, keeps the record
    ...
    path = recorder.save(summaries, interrupted=False)    # -> the .json path
    for note in recorder.take_notes(): print(note)       # py-spy problems, the ops table (rich), ...
    recorder.detach()                 # optional: removes the hooks

Files, all with one stem `<stamp>-<target>-<draft>` chosen when the recorder is made (the stamp is unique
to the millisecond in the folder): `.json` (schema specview.profile/1, docs/design/profiles.md),
`.trace.json` (Chrome Trace Event: Perfetto, chrome://tracing), `.speedscope.json` (speedscope), and
with the options `.ops.trace.json` (torch.profiler) and `.py-spy.speedscope.json`. Every write is atomic
(temp file, then rename). save() may be called again (the TUI's `e`, then quit): it rewrites the same
files with every step recorded so far. The op capture and py-spy stop at the first save().
With `max_steps` (a server that runs for days) the recorder keeps only the newest max_steps steps, a ring:
the profile covers those, and its summary says how many older ones were let go (`steps_dropped`).
Never imports textual.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque

from specview.core.errors import SpecviewError
from specview.core.events import StepResult
from specview.core.file_schemas import PROFILE_SCHEMA
from specview.core.files import clean_name, ensure_writable_dir, write_json_atomic
from specview.core.phases import FORWARD_PHASES
from specview.engine.phase_timer import PhaseTimer
from specview.profiling.export import (
    PackedSpans,
    StepRecord,
    chrome_trace,
    speedscope,
    synthetic_timing,
)
from specview.profiling.hooks import NormHooks
from specview.profiling.profile import summarize
from specview.profiling.roofline import session_roofline

AUTOSAVE_S = 20.0  # seconds between autosaves of the profile JSON during a long run (at most 2% of the time)
_TAKEN: set[str] = set()  # stems handed out in this process (two recorders in one millisecond)


def layernorm_source(lm, hooked: int) -> str:
    """How a model's layernorm time is known: timed by hooks on its norm modules, modelled where the engine's own
    forward runs (its norms fused into the kernels around them: cpu/forward/llama.py, norm_ms), or not at all."""
    if lm.forward.runner is not None:
        return "modelled: each norm of the engine's forward timed apart at the forward's row count"
    if hooked:
        return f"hooks on the norm modules ({hooked})"
    return "unmeasured: no norm module in this model's forward"


def phase_sources(device, layernorm: dict[str, str]) -> dict:
    """meta.phase_sources: how each phase of the profile was measured."""
    clock = {"cuda": "CUDA events, resolved once per step", "mps": "host clock, synchronised at phase edges"}.get(
        device.type, "host clock")
    return {"draft": clock, "verify": clock, "sample": clock, "cache": clock,
            "other": "the step's wall time less the measured phases", "softmax": f"{clock}, inside sample",
            "layernorm": layernorm}


class ProfileRecorder:
    def __init__(self, session, method: str, profile_dir: str = "profiles", *, profile_ops: bool = False,
                 py_spy: bool = False, max_steps: int | None = None):
        self.session = session
        self.method = method
        self.dir = profile_dir
        self.timer = PhaseTimer(session.device)
        self.hooks = NormHooks(self.timer)
        self.max_steps = max_steps  # None: every step; else the newest max_steps (a ring)
        self.records: deque[StepRecord] = deque(maxlen=max_steps)
        self.dropped = 0  # steps the ring let go, oldest first
        self.notes: list = []  # one-line messages (and rich tables) for the client: see take_notes()
        self.interrupted = False
        self.origin = time.perf_counter()  # time zero of the trace files
        self.norm_counts: dict[str, int] = {}
        self.meta = self._meta()
        self.meta["max_steps"] = max_steps
        ensure_writable_dir(profile_dir, "--profile-dir")
        self.stem = os.path.join(profile_dir, self._unique_stem())
        self.path = self.stem + ".json"
        self.trace_path = self.stem + ".trace.json"
        self.speedscope_path = self.stem + ".speedscope.json"
        self.ops = self.py_spy = None
        self.ops_summary: dict | None = None
        if profile_ops:
            from specview.profiling.ops import OpsCapture

            self.ops = OpsCapture(self.stem + ".ops.trace.json", session.device)
        if py_spy:
            from specview.profiling.pyspy import PySpy

            self.py_spy = PySpy(self.stem + ".py-spy.speedscope.json")
        self._started = False
        self.summaries_seen: list = []  # the run summaries given to the last save(), for autosaves
        self._next_autosave = time.perf_counter() + AUTOSAVE_S

    def attach(self, decoder) -> None:
        """Hook the norm modules of the decoder's models and make it time into this recorder's timer.
        The first call also times t_ar for a speculative profile (its c and v need it; before the hooks,
        like an autoregressive forward) and starts the op capture and py-spy. Attaching more decoders is fine."""
        if self.method == "speculative" and self.meta.get("t_ar_ms") is None and not self._started:
            from specview.profiling.target_token_time import time_target_token

            self.meta["t_ar_ms"] = time_target_token(decoder, self.session.prompt_ids)
        decoder.timer = self.timer
        for role, lm in (("target", decoder.target), ("draft", decoder.draft)):
            if lm is not None:
                self.norm_counts[role] = self.norm_counts.get(role, 0) + self.hooks.install(lm.model)
        self.meta["norm_modules"] = dict(self.norm_counts)
        self.meta["phase_sources"] = phase_sources(self.timer.device, {
            role: layernorm_source(lm, self.norm_counts.get(role, 0))
            for role, lm in (("target", decoder.target), ("draft", decoder.draft)) if lm is not None})
        if not self._started:
            self._started = True
            if self.py_spy is not None:
                problem = self.py_spy.start()
                if problem:
                    self.notes.append(problem)
                    self.py_spy = None
            if self.ops is not None:
                self.timer.labels = True
                self.ops.start()

    def take_notes(self) -> list:
        """The messages (one-line strings, rich tables) gathered since the last call, for the client to print."""
        notes, self.notes = self.notes, []
        return notes

    def detach(self) -> None:
        """Remove the hooks (the profile stays; save() still works)."""
        self.hooks.remove()
        self.timer.labels = False

    def add_step(self, step: StepResult) -> None:
        """Keep one step (call it right after step(), before writing the step anywhere): fills
        step.layernorm_ms = {"draft": .., "verify": ..} from the hooks when they are on."""
        timing = step.timing if step.timing is not None and step.timing.t1 > self.origin else None
        if timing is not None and self.hooks.handles:
            split = timing.parts.get("layernorm", {})
            step.layernorm_ms = {name: split.get(name, 0.0) for name in FORWARD_PHASES}
        record = step.to_json()
        if timing is None:  # the timer no longer has it (or another timer ran it): lay its phases end to end
            t0 = self.records[-1].timing.t1 if self.records else self.origin
            timing = synthetic_timing(record, t0)
        else:
            timing = dataclasses.replace(timing, nested_spans=PackedSpans(timing.nested_spans))  # ~7x smaller (bundled pair)
        if self.max_steps is not None and len(self.records) == self.max_steps:
            self.dropped += 1  # the append below lets the oldest go
        self.records.append(StepRecord(record, timing))
        if time.perf_counter() >= self._next_autosave:
            self._autosave()

    def _autosave(self) -> None:
        """Between steps, now and then: rewrite the profile JSON so even a hard crash (killed, out of
        memory) leaves the steps done so far. The trace files are written by save()."""
        t0 = time.perf_counter()
        try:
            # marked interrupted: if the process dies now, that is what this file is; save() rewrites it
            write_json_atomic(self.path, self.profile(self.summaries_seen, interrupted=True))
        except (OSError, ValueError):
            pass  # save() reports a real write problem
        took = time.perf_counter() - t0
        self._next_autosave = time.perf_counter() + max(AUTOSAVE_S, 50 * took)

    @property
    def steps(self) -> list[dict]:
        return [r.step for r in self.records]

    def profile(self, summaries=(), interrupted: bool = False) -> dict:
        """The profile document (schema specview.profile/1) of every step recorded so far."""
        summaries = list(summaries or ())
        runs = {r.step.get("run") for r in self.records}
        prefill = sum(s.prefill_ms for s in summaries)
        summary = summarize(self.steps, prefill, self.meta.get("t_ar_ms"), self.meta.get("roofline"))
        summary.update(method=self.method, runs=len(runs), interrupted=interrupted,
                       stop_reasons=[s.stop_reason for s in summaries], steps_dropped=self.dropped)
        doc = {"schema": PROFILE_SCHEMA, "meta": self.meta, "summary": summary, "steps": self.steps}
        if self.ops_summary is not None:
            doc["ops"] = self.ops_summary
        return doc

    def save(self, summaries=(), interrupted: bool = False) -> str:
        """Write the profile, its trace and speedscope files (atomically) -> the profile's path.
        Stops the op capture and py-spy first (their messages go to self.notes)."""
        self.interrupted = self.interrupted or interrupted
        self.summaries_seen = list(summaries or ())
        if self.ops is not None and self.ops.running:
            self.timer.labels = False
            try:
                self.ops_summary = self.ops.stop()
            except Exception as err:  # noqa: BLE001 - the op capture must never cost the profile itself
                self.notes.append(f"op-level capture failed ({type(err).__name__}: {err}); the profile is fine")
            else:
                self.meta["files"]["ops_trace"] = os.path.basename(self.ops.trace_path)
                self.notes.append(f"op-level trace written: {self.ops.trace_path}")
                from specview.profiling.ops_table import ops_table

                self.notes.append(ops_table(self.ops_summary))
        if self.py_spy is not None:
            note = self.py_spy.stop()
            if note.startswith("py-spy profile written"):
                self.meta["files"]["py_spy"] = os.path.basename(self.py_spy.out_path)
            self.notes.append(note)
            self.py_spy = None
        doc = self.profile(summaries, self.interrupted)
        self._place_prefills(summaries)
        trace_meta = {"method": self.method, "target": self.meta["target"], "draft": self.meta["draft"],
                      "profile": os.path.basename(self.path)}
        try:
            write_json_atomic(self.path, doc)
            write_json_atomic(self.trace_path, chrome_trace(self.records, self.origin, trace_meta,
                                                            self.meta.get("roofline")))
            write_json_atomic(self.speedscope_path,
                              speedscope(self.records, self.origin, os.path.basename(self.stem)))
        except OSError as err:
            raise SpecviewError(f"cannot write the profile to {self.dir}: {err.strerror}") from err
        return self.path

    def _place_prefills(self, summaries) -> None:
        """Each run's prefill ends where its first step starts (the engine prefills inside the first step())."""
        prefill = {s.run: s.prefill_ms / 1000 for s in summaries or ()}
        previous_end, run = self.origin, None
        for rec in self.records:
            if rec.step.get("run") != run:
                run = rec.step.get("run")
                rec.prefill_s = min(prefill.get(run, 0.0), max(rec.timing.t0 - previous_end, 0.0))
            previous_end = rec.timing.t1

    def _meta(self) -> dict:
        meta = self.session.meta()
        settings = self.session.settings
        draft = settings.draft if self.method == "speculative" else None
        meta.update(method=self.method, target=settings.target, draft=draft, k=settings.k,
                    norm_modules={}, files={}, t_ar_ms=None)
        # Bytes per forward of each model and the machine's bandwidth (probed once, cached): the roofline.
        meta["roofline"] = session_roofline(self.session, drafters=self.method == "speculative")
        return meta

    def _unique_stem(self) -> str:
        draft = self.meta["draft"] or self.method
        names = f"{clean_name(self.meta['target'])}-{clean_name(draft)}"
        t = time.time()
        while True:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(t)) + f"-{int(t * 1000) % 1000:03d}"
            stem = f"{stamp}-{names}"
            taken = stem in _TAKEN or any(name.startswith(stem + ".") for name in os.listdir(self.dir))
            if not taken:
                _TAKEN.add(stem)
                self.meta["files"] = {"profile": stem + ".json", "trace": stem + ".trace.json",
                                      "speedscope": stem + ".speedscope.json"}
                return stem
            t += 0.001
