"""`specview report`: one profile, two compared, a bench file, and every bad file (one line, exit 2)."""

import glob
import json
import os
import subprocess
import sys

import pytest

from specview.analysis.profile_view import largest_overheads
from specview.cli.main import main

BENCH = {
    "schema": "specview.bench/1",
    "config": {"target": "smollm2-135m", "draft": "smollm2-135m@bfloat16", "k": 4, "max_new_tokens": 48},
    "methods": {
        "autoregressive": {"mean_s": 2.0, "std_s": 0.1, "tokens_per_s": 24.0, "runs": [2.0, 2.1, 1.9]},
        "speculative": {"mean_s": 1.5, "std_s": 0.05, "tokens_per_s": 32.0, "runs": [1.5, 1.5, 1.5]},
        "hf_assisted": {"mean_s": 1.8, "std_s": 0.1, "tokens_per_s": 26.7, "runs": [1.8]},
    },
    "acceptance_rate": 0.9, "mean_emitted_per_step": 4.4, "per_position_acceptance": [0.97, 0.93, 0.9, 0.85],
    "cost_ratio": 0.62, "verify_cost_ratio": 1.3, "ideal_speedup": 1.27, "theoretical_speedup": 1.15,
    "speedup": 1.33, "efficiency": 1.16,
    "sweep": [{"k": 2, "acceptance_rate": 0.95, "methods": {"speculative": {"tokens_per_s": 30.0}}}],
}


def report(capsys, *files):
    try:
        code = main(["report", *map(str, files)])
    except SystemExit as exit_:
        code = exit_.code
    return (code, *capsys.readouterr())


@pytest.fixture(scope="module")
def profiles(gpt2_paths, tmp_path_factory):
    """Two profiles of the tiny pair: K=2 and K=3."""
    folder = tmp_path_factory.mktemp("profiles")
    paths = []
    for k in ("2", "3"):
        out = folder / k
        code = main(["run", "--target", gpt2_paths[0], "--draft", gpt2_paths[1], "-N", "10", "-K", k,
                     "--ignore-eos", "--profile-dir", str(out), "-q"])
        assert code == 0
        paths.append(next(p for p in glob.glob(str(out / "*.json")) if not p.endswith((".trace.json", ".speedscope.json"))))
    return paths


def test_report_one_profile(capsys, profiles):
    code, out, err = report(capsys, profiles[0])
    assert code == 0 and not err
    for words in ("where the time goes", "draft", "verify", "layernorm", "softmax", "other", "% of wall",
                  "of verify", "acceptance per draft position", "memory peak", "largest overheads",
                  "what each phase contains", "K=2"):
        assert words in out, words
    assert "n/a" in out  # device memory on CPU


def test_report_folder_picks_newest(capsys, profiles):
    code, out, _ = report(capsys, os.path.dirname(profiles[1]))
    assert code == 0 and "K=3" in out


def test_report_compares_two(capsys, profiles):
    code, out, err = report(capsys, *profiles)
    assert code == 0, err
    assert "A: " in out and "B: " in out and "B / A" in out and "k: 2 → 3" in out
    assert "phases, ms per step" in out and "largest overheads in B" in out


def test_report_bench_file(capsys, tmp_path, profiles):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(BENCH))
    code, out, err = report(capsys, path)
    assert code == 0, err
    assert "speculative" in out and "1.33x" in out and "hf_assisted" in out and "efficiency" in out
    assert "sweep over K" in out
    code, out, _ = report(capsys, path, path)
    assert code == 0 and "tokens/s per method" in out
    code, out, _ = report(capsys, profiles[0], path)  # mixed kinds: one after the other
    assert code == 0 and "where the time goes" in out and "methods" in out


def test_overheads_in_words():
    summary = {"wall_ms": 1000.0, "steps": 10, "drafted": 40, "accepted": 30, "prefill_ms": 10.0,
               "phases_ms": {"draft": 300.0, "verify": 500.0, "sample": 60.0, "cache": 5.0, "other": 125.0,
                             "softmax": 20.0, "layernorm": 120.0},
               "layernorm_ms": {"draft": 30.0, "verify": 90.0}}
    lines = largest_overheads(summary)
    assert len(lines) == 3
    assert lines[0].startswith("unmeasured step time") and "12.5% of wall" in lines[0]
    assert lines[1].startswith("layernorm is 18.0% of verify time")
    assert lines[2].startswith("drafting the 10 of 40 draft tokens that were rejected")


BAD = {
    "empty.json": b"",
    "blank.json": b"  \n",
    "truncated.json": b'{"schema": "specview.profile/1", "meta": {"config": {',
    "garbage.json": b"{not json at all}",
    "binary.json": b"\xff\xfe\x00\x01",
    "list.json": b"[1, 2, 3]",
    "foreign.json": b'{"name": "package.json", "version": "1.0"}',
    "future.json": b'{"schema": "specview.profile/2", "meta": {}, "summary": {}, "steps": []}',
    "old-bench.json": b'{"schema": "specview.bench/0", "methods": {}}',
    "other-schema.json": b'{"schema": "something.else/1"}',
    "damaged.json": b'{"schema": "specview.profile/1", "meta": {}, "summary": {"wall_ms": 1}, "steps": []}',
    "x.trace.json": b'{"traceEvents": []}',
    "events.jsonl": b'{"type": "start", "schema": "specview.events/1"}\n{"type": "end"}\n',
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_files_one_line_exit_2(capsys, tmp_path, name):
    path = tmp_path / name
    path.write_bytes(BAD[name])
    code, out, err = report(capsys, path)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("specview report: error: ")
    assert "Traceback" not in err and not out


def test_bad_file_messages_say_what_is_wrong(capsys, tmp_path):
    cases = {"truncated.json": "truncated", "future.json": "specview.profile/1", "x.trace.json": "perfetto",
             "events.jsonl": "--jsonl", "empty.json": "empty", "foreign.json": "no \"schema\"",
             "damaged.json": "summary.phases_ms"}
    for name, words in cases.items():
        path = tmp_path / name
        path.write_bytes(BAD[name])
        _, _, err = report(capsys, path)
        assert words.lower() in err.lower(), (name, err)
    _, _, err = report(capsys, tmp_path / "missing.json")
    assert "no such file" in err


def test_report_subprocess_exit_code(tmp_path):
    bin_dir = os.path.dirname(sys.executable)
    exe = os.path.join(bin_dir, "specview")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "specview"]
    proc = subprocess.run([*cmd, "report", str(tmp_path / "nope.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "nope.json" in proc.stderr and not proc.stdout
    proc = subprocess.run([*cmd, "report"], capture_output=True, text=True)  # usage error, also one line
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
