"""The profiler: phase accounting, norm hooks, profile / trace / speedscope files, interrupted runs."""

import glob
import json
import os
import subprocess
import sys

import pytest
import torch

import tiny
from helpers import run_cli
from specview.cli.main import main
from specview.core.files import write_json_atomic
from specview.core.phases import PHASE_KEYS
from specview.core.settings import Settings
from specview.engine.phase_timer import PhaseTimer
from specview.profiling.export import (
    StepRecord,
    chrome_trace,
    speedscope,
    synthetic_timing,
)
from specview.profiling.hooks import NormHooks, norm_modules
from specview.profiling.recorder import ProfileRecorder, clean_name
from specview.session import open_session

DESIGN_SUMMARY = {"wall_ms", "phases_ms", "layernorm_ms", "steps", "drafted", "accepted", "acceptance_rate", "alpha",
                  "per_position_acceptance", "tokens_per_s", "memory_peak_mb"}
DESIGN_META = {"config", "seed", "versions", "device", "cpu", "threads", "started_at"}
STEP_KEYS = {"run", "step", "drafted", "q", "p", "r", "accepted", "rejected_at", "resampled", "residual_top", "bonus",
             "emitted", "tokens", "stop_reason", "phases_ms", "memory_mb"}




def profile_files(folder):
    main_files = [p for p in glob.glob(os.path.join(folder, "*.json"))
                  if not p.endswith((".trace.json", ".speedscope.json"))]
    assert len(main_files) == 1, os.listdir(folder)
    stem = main_files[0][: -len(".json")]
    with open(main_files[0]) as f:
        profile = json.load(f)
    with open(stem + ".trace.json") as f:
        trace = json.load(f)
    with open(stem + ".speedscope.json") as f:
        scope = json.load(f)
    return main_files[0], profile, trace, scope


def session_for(paths, **kw):
    settings = Settings(target=paths[0], draft=paths[1], prompt="w1 w2 w3", max_new_tokens=kw.pop("n", 12),
                        temperature=kw.pop("temperature", 0.0), ignore_eos=True, device="cpu", **kw)
    return open_session(settings)


def assert_trace_nests(trace):
    """Every X event on a tid either contains or is disjoint from every other (in whole ns)."""
    by_tid = {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            start = round(ev["ts"] * 1000)
            by_tid.setdefault(ev["tid"], []).append((start, start + round(ev["dur"] * 1000), ev["name"]))
    for tid, spans in by_tid.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end, name in spans:
            assert end >= start
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack:  # inside the open parent: must end by its end
                assert end <= stack[-1][1], f"tid {tid}: {name} [{start},{end}] pokes out of {stack[-1]}"
            stack.append((start, end, name))


def assert_speedscope_valid(scope):
    assert scope["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    (prof,) = scope["profiles"]
    assert prof["type"] == "evented"
    stack, last = [], 0.0
    for ev in prof["events"]:
        assert ev["at"] >= last
        last = ev["at"]
        if ev["type"] == "O":
            stack.append(ev["frame"])
        else:
            assert stack and stack.pop() == ev["frame"]
    assert not stack and last <= prof["endValue"]
    names = {f["name"] for f in scope["shared"]["frames"]}
    assert {"step", "draft", "verify", "sample"} <= names


def test_run_profile_files_golden_structure(capsys, pair_paths, tmp_path):
    out_dir = tmp_path / "p"
    code, out, err = run_cli(capsys, "run", "--target", pair_paths[0], "--draft", pair_paths[1], "--prompt", "w1 w2 w3",
                         "-N", "12", "-K", "3", "--temperature", "0", "--ignore-eos", "--profile-dir", str(out_dir),
                         "-q")
    assert code == 0, err
    path, profile, trace, scope = profile_files(out_dir)
    assert f"profile written: {path}" in err.replace("\n", "")
    name = os.path.basename(path)
    assert "@" not in name and name.count("-") >= 4  # <stamp>-<target>-<draft>.json
    assert set(profile) == {"schema", "meta", "summary", "steps"}
    assert profile["schema"] == "specview.profile/1"
    assert DESIGN_META <= set(profile["meta"])
    s = profile["summary"]
    assert DESIGN_SUMMARY <= set(s)
    assert set(PHASE_KEYS) <= set(s["phases_ms"])
    assert set(s["layernorm_ms"]) == {"draft", "verify"} and s["layernorm_ms"]["draft"] > 0
    assert set(s["memory_peak_mb"]) == {"rss", "device"} and s["memory_peak_mb"]["rss"] > 0
    assert s["memory_peak_mb"]["device"] is None  # CPU: no device memory
    assert s["steps"] == len(profile["steps"]) and sum(len(x["emitted"]) for x in profile["steps"]) == 12
    assert len(s["per_position_acceptance"]) == 3
    assert all(STEP_KEYS <= set(x) for x in profile["steps"])
    assert abs(sum(x["wall_ms"] for x in profile["steps"]) + s["prefill_ms"] - s["wall_ms"]) < 1e-6

    events = trace["traceEvents"]
    names = {(e["ph"], e["name"]) for e in events}
    assert {("X", "draft"), ("X", "verify"), ("X", "sample"), ("X", "layernorm"), ("X", "softmax"),
            ("X", "prefill"), ("C", "memory MiB"), ("C", "acceptance")} <= names
    threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks = {e["name"]: threads[e["tid"]] for e in events if e["ph"] == "X" and not e["name"].startswith("step")}
    assert tracks["draft"] == "draft model" and tracks["verify"] == "target model" and tracks["sample"] == "sampling"
    steps = [e for e in events if e["ph"] == "X" and e["name"].startswith("step ")]
    assert len(steps) == s["steps"]
    assert_trace_nests(trace)
    assert_speedscope_valid(scope)
    # norm spans sit on the track of the model they ran in
    ln_tracks = {threads[e["tid"]] for e in events if e["ph"] == "X" and e["name"] == "layernorm"}
    assert ln_tracks == {"draft model", "target model"}


def test_phase_accounting(pair_paths, tmp_path):
    session = session_for(pair_paths, n=16, temperature=1.0)
    recorder = ProfileRecorder(session, "speculative", str(tmp_path))
    decoder = session.decoder("speculative", timer=recorder.timer)
    recorder.attach(decoder)
    steps = list(decoder.generate(session.prompt_ids, 16))
    for step in steps:
        recorder.add_step(step)
        ph = step.phases_ms
        measured = sum(ph[k] for k in ("draft", "verify", "sample", "cache"))
        assert measured <= step.wall_ms + 1e-9
        assert ph["other"] >= 0 and abs(measured + ph["other"] - step.wall_ms) < 1e-6
        assert ph["softmax"] <= ph["sample"] + 1e-9
        assert ph["layernorm"] <= ph["draft"] + ph["verify"] + 1e-9
        assert 0 < step.layernorm_ms["verify"] <= ph["verify"]
        assert step.layernorm_ms["draft"] <= ph["draft"]
        assert abs(step.layernorm_ms["draft"] + step.layernorm_ms["verify"] - ph["layernorm"]) < 1e-6
    assert any(s.layernorm_ms["draft"] > 0 for s in steps)
    recorder.detach()
    assert not recorder.hooks.handles


@pytest.mark.parametrize("kind, norm_class", [("gpt2", "LayerNorm"), ("llama", "LlamaRMSNorm")])
def test_norm_hooks_fire(kind, norm_class):
    model = tiny.make_model(kind, 16, 0, layers=3)
    norms = norm_modules(model)
    assert len(norms) == 3 * 2 + 1  # two per block + the final norm
    assert {type(m).__name__ for m in norms} == {norm_class}
    timer = PhaseTimer("cpu")
    hooks = NormHooks(timer)
    assert hooks.install(model) == 7 and hooks.install(model) == 0  # attaching twice hooks once
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        model(ids)  # outside any phase (a prefill): not counted
        timer.start_step()
        assert "layernorm" not in timer.ms
        with timer.phase("verify"):
            model(ids)
        phases, wall = timer.end_step()
    assert phases["layernorm"] > 0 and timer.last.parts["layernorm"] == {"verify": phases["layernorm"]}
    assert len(timer.last.nested_spans) == 7
    assert all(t0 >= timer.last.spans[0][1] and t1 <= timer.last.spans[0][2] for _, _, t0, t1 in
               timer.last.nested_spans)
    hooks.remove()
    timer.start_step()
    with timer.phase("verify"), torch.no_grad():
        model(ids)
    assert timer.end_step()[0]["layernorm"] == 0.0


def test_timer_nested_outside_phase_dropped():
    timer = PhaseTimer("cpu")
    timer.start_step()
    timer.nested("layernorm", 0.0, 1.0)  # no phase open
    with timer.phase("sample"), timer.phase("softmax"):
        assert timer.current == "sample"
    phases, wall = timer.end_step()
    assert phases["layernorm"] == 0.0 and phases["softmax"] <= phases["sample"]
    assert timer.last.wall_ms == wall and [name for name, _, _ in timer.last.spans] == ["softmax", "sample"]


def test_synthetic_timing_when_spans_unknown():
    step = {"run": 0, "step": 0, "drafted": [1], "accepted": 1, "emitted": [1, 2], "wall_ms": 10.0,
            "phases_ms": {"draft": 2.0, "verify": 5.0, "sample": 1.0, "cache": 0.5, "other": 1.5}, "memory_mb": {}}
    recs = [StepRecord(step, synthetic_timing(step, 1.0))]
    recs.append(StepRecord(dict(step, step=1), synthetic_timing(step, recs[0].timing.t1)))
    trace = chrome_trace(recs, 1.0, {})
    assert_trace_nests(trace)
    assert_speedscope_valid(speedscope(recs, 1.0, "x"))
    verify = [e for e in trace["traceEvents"] if e.get("name") == "verify"]
    assert verify[0]["ts"] == 2000.0 and verify[0]["dur"] == 5000.0


def test_interrupted_run_leaves_valid_profile(capsys, gpt2_paths, tmp_path, monkeypatch):
    from specview.engine import decoder

    real_step, calls = decoder.Run.step, []

    def step(self):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(decoder.Run, "step", step)
    code, out, err = run_cli(capsys, "run", "--target", gpt2_paths[0], "--draft", gpt2_paths[1], "-N", "30",
                         "--ignore-eos", "--profile-dir", str(tmp_path), "-q")
    assert code == 130
    path, profile, trace, scope = profile_files(tmp_path)
    assert profile["summary"]["steps"] == 2 and profile["summary"]["interrupted"] is True
    assert_trace_nests(trace)
    assert_speedscope_valid(scope)
    assert main(["report", path]) == 0
    assert "interrupted" in capsys.readouterr().out
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def test_crash_mid_run_still_saves(capsys, gpt2_paths, tmp_path, monkeypatch):
    from specview.engine import decoder

    real_step, calls = decoder.Run.step, []

    def step(self):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real_step(self)

    monkeypatch.setattr(decoder.Run, "step", step)
    with pytest.raises(RuntimeError):
        main(["run", "--target", gpt2_paths[0], "--draft", gpt2_paths[1], "-N", "30", "--ignore-eos",
              "--profile-dir", str(tmp_path), "-q"])
    _, profile, _, _ = profile_files(tmp_path)
    assert profile["summary"]["steps"] == 1


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = str(tmp_path / "x.json")
    write_json_atomic(path, {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"a": float("nan")})  # JSON has no NaN: refused, nothing half-written
    with open(path) as f:
        assert json.load(f) == {"a": 1}
    assert os.listdir(tmp_path) == ["x.json"]
    assert oct(os.stat(path).st_mode & 0o777) != "0o600"


def test_stems_unique_and_clean(gpt2_paths, tmp_path):
    session = session_for(gpt2_paths)
    a = ProfileRecorder(session, "speculative", str(tmp_path))
    b = ProfileRecorder(session, "speculative", str(tmp_path))
    assert a.stem != b.stem
    assert clean_name("smollm2-135m@bfloat16") == "smollm2-135m_bfloat16"
    assert clean_name("openai-community/gpt2") == "openai-community_gpt2"
    ar = ProfileRecorder(session, "autoregressive", str(tmp_path))
    assert ar.stem.endswith("-autoregressive") and ar.meta["draft"] is None


def test_autoregressive_profile_and_resave(gpt2_paths, tmp_path):
    session = session_for(gpt2_paths, n=6)
    recorder = ProfileRecorder(session, "autoregressive", str(tmp_path))
    decoder = session.decoder("autoregressive")
    recorder.attach(decoder)  # wires the recorder's timer into a decoder made without it
    run = decoder.start(session.prompt_ids, 6)
    recorder.add_step(run.step())
    first = recorder.save([run.summary])
    while not run.done:
        recorder.add_step(run.step())
    assert recorder.save([run.summary]) == first  # the TUI's `e`, then quit: same files, more steps
    _, profile, trace, _ = profile_files(tmp_path)
    s = profile["summary"]
    assert s["steps"] == 6 and s["drafted"] == 0 and s["acceptance_rate"] is None
    assert s["layernorm_ms"]["draft"] == 0 and s["layernorm_ms"]["verify"] > 0
    assert not [e for e in trace["traceEvents"] if e.get("name") == "draft"]


def test_profile_ops(capsys, gpt2_paths, tmp_path):
    code, out, err = run_cli(capsys, "run", "--target", gpt2_paths[0], "--draft", gpt2_paths[1], "-N", "8",
                         "--ignore-eos", "--profile-ops", "--profile-dir", str(tmp_path), "-q")
    assert code == 0, err
    ops_files = glob.glob(str(tmp_path / "*.ops.trace.json"))
    assert len(ops_files) == 1
    with open(ops_files[0]) as f:
        assert json.load(f)["traceEvents"]
    path = ops_files[0].replace(".ops.trace.json", ".json")
    with open(path) as f:
        ops = json.load(f)["ops"]
    names = [o["name"] for o in ops["top"]]
    assert any("addmm" in n or "mm" in n or "linear" in n for n in names)
    assert ops["phase_ms"]["verify"] > 0 and ops["phase_ms"]["draft"] > 0
    assert any((o["verify_share"] or 0) > 0 for o in ops["top"])
    assert "top operators" in err
    assert main(["report", path]) == 0
    assert "top operators" in capsys.readouterr().out


def test_py_spy_runs_or_says_why(capsys, gpt2_paths, tmp_path):
    code, out, err = run_cli(capsys, "run", "--target", gpt2_paths[0], "--draft", gpt2_paths[1], "-N", "8",
                         "--ignore-eos", "--py-spy", "--profile-dir", str(tmp_path), "-q")
    assert code == 0, err
    lines = [line for line in err.splitlines() if "py-spy" in line]
    assert lines, err
    if glob.glob(str(tmp_path / "*.py-spy.speedscope.json")):
        assert "py-spy profile written" in err
    else:  # no file: exactly one of py-spy's known reasons, in one line, and the run went on
        from specview.profiling.pyspy import PTRACE_HELP

        reasons = (PTRACE_HELP, "py-spy is not installed", "py-spy could not start", "py-spy stopped (",
                   "py-spy did not finish writing")
        assert len(lines) == 1 and lines[0].startswith(reasons), lines


def test_profiler_never_imports_textual():
    code = ("import sys; import specview.profiling.recorder, specview.cli.report, specview.profiling.ops, "
            "specview.profiling.pyspy, specview.engine.decoder, specview.cli.run; "
            "sys.exit(1 if any(m == 'textual' or m.startswith('textual.') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_py_spy_without_ptrace_says_so_in_one_line(tmp_path, monkeypatch):
    from specview.profiling import pyspy

    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission Denied: Try running again with elevated permissions' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(pyspy, "find_py_spy", lambda: str(fake))
    message = pyspy.PySpy(str(tmp_path / "out.json")).start()
    assert message == pyspy.PTRACE_HELP and "\n" not in message and "CAP_SYS_PTRACE" in message


def test_autosave_and_trace_cap(gpt2_paths, tmp_path, monkeypatch):
    from specview.profiling import export
    from specview.profiling import recorder as recorder_module

    monkeypatch.setattr(recorder_module, "AUTOSAVE_S", 0.0)
    monkeypatch.setattr(export, "MAX_NESTED_EVENTS", 30)
    session = session_for(gpt2_paths, n=6)
    recorder = ProfileRecorder(session, "speculative", str(tmp_path))
    decoder = session.decoder("speculative", timer=recorder.timer)
    recorder.attach(decoder)
    run = decoder.start(session.prompt_ids, 6)
    recorder.add_step(run.step())
    with open(recorder.path) as f:  # written between steps, before any save(): survives a hard crash
        assert json.load(f)["summary"]["steps"] == 1
    while not run.done:
        recorder.add_step(run.step())
    recorder.save([run.summary])
    _, profile, trace, _ = profile_files(tmp_path)
    assert_trace_nests(trace)
    norms = [e for e in trace["traceEvents"] if e.get("name") == "layernorm"]
    assert 0 < len(norms) <= 30 and "note" in trace["otherData"]
