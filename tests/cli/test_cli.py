"""`specview run` end to end on tiny models, and every bad input: one line on stderr, exit 2."""

import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import run_cli


@pytest.fixture
def models(gpt2_paths):
    return ["--target", gpt2_paths[0], "--draft", gpt2_paths[1]]


def test_run_prints_stream_and_summary(capsys, models):
    code, out, err = run_cli(capsys, "run", *models, "--prompt", "w1 w2 w3", "-N", "12", "-K", "3", "--ignore-eos")
    assert code == 0
    assert "w1 w2 w3" in out  # the prompt, then the coloured continuation
    assert "accept" in out and "tokens/s" in out and "length" in out


def test_jsonl_to_stdout_carries_only_json(capsys, models):
    code, out, err = run_cli(capsys, "run", *models, "--prompt", "w1 w2", "-N", "10", "--num-runs", "3",
                             "--jsonl", "-", "--temperature", "1", "--ignore-eos")
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["type"] == "start" and events[0]["schema"] == "specview.events/1"
    assert events[0]["num_runs"] == 3 and events[0]["prompt_ids"] == [4, 5]  # w1 w2
    ends = [e for e in events if e["type"] == "end"]
    assert [e["run"] for e in ends] == [0, 1, 2]
    assert all(len(e["generated_ids"]) == 10 and e["stop_reason"] == "length" for e in ends)
    steps = [e for e in events if e["type"] == "step"]
    keys = {"run", "step", "drafted", "q", "p", "r", "accepted", "rejected_at", "resampled", "residual_top",
            "bonus", "emitted", "tokens", "stop_reason", "phases_ms", "memory_mb"}
    assert all(keys <= set(s) for s in steps)
    assert {"draft", "verify", "sample", "cache", "other", "softmax", "layernorm"} <= set(steps[0]["phases_ms"])
    assert "rss" in steps[0]["memory_mb"] and steps[0]["memory_mb"]["device_allocated"] is None
    # runs are independent samples from one generator: not all the same
    assert len({tuple(e["generated_ids"]) for e in ends}) > 1
    assert "NaN" not in out
    assert "tokens/s" in err  # the summary went to stderr


def test_autoregressive_method_and_file_output(capsys, models, tmp_path):
    path = tmp_path / "ev.jsonl"
    code, out, err = run_cli(capsys, "run", *models, "--method", "autoregressive", "-N", "6", "--jsonl", str(path),
                             "--temperature", "0")
    assert code == 0
    events = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 6
    assert all(s["drafted"] == [] and s["r"] == [] and s["emitted"] == [s["bonus"]] for s in steps)
    assert events[-1]["acceptance_rate"] is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_step_finishes_the_step_then_stops(capsys, models, monkeypatch, sig):
    """A signal delivered inside the third step (to this process, whatever SIGINT disposition pytest
    inherited): the handler only sets the stop flag, the step completes, the loop stops before the fourth,
    and the end event, the summary and exit 130 follow."""
    from specview.engine.decoder import Run

    real_step = Run.step

    def signal_in_third(self):
        if self.summary.steps == 2:
            os.kill(os.getpid(), sig)
        return real_step(self)

    monkeypatch.setattr(Run, "step", signal_in_third)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job inherits it: must not matter
    try:
        code, out, err = run_cli(capsys, "run", *models, "-N", "40", "--jsonl", "-", "--ignore-eos")
        restored = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert restored == signal.SIG_IGN  # the command put back what it found
    assert code == 130
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in events].count("step") == 3
    assert events[-1]["type"] == "end" and events[-1]["stop_reason"] == "interrupted"
    assert events[-1]["steps"] == 3
    assert "tokens/s" in err  # the summary table


BAD = [
    (["-K", "0"], "-K must be >= 1"),
    (["-N", "0"], "-N must be >= 1"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-k", "-3"], "--top-k must be >= 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["-K", "many"], "must be an integer"),
    (["--num-runs", "0"], "--num-runs must be >= 1"),
    (["--device", "tpu"], "invalid choice"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_values_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, "run", *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_bad_models_exit_2_with_one_line(capsys, gpt2_paths, tiny_dir):
    import tiny

    cases = [
        (["--target", "/no/such/folder"], "model folder not found"),
        (["--target", "missing.gguf"], "model file not found"),
        (["--target", "gpt2-xl", "--method", "autoregressive"], "hub cannot be reached"),
        (["--target", gpt2_paths[0], "--draft", gpt2_paths[1] + "@float8"], "unknown dtype"),
    ]
    other = tiny.save(tiny.make_model("gpt2", 16, 1), tiny.make_tokenizer(16, prefix="v"), tiny_dir / "cli-vocab")
    capsys.readouterr()
    cases.append((["--target", gpt2_paths[0], "--draft", other], "different tokenizers"))
    cases.append((["--target", gpt2_paths[0], "--draft", gpt2_paths[1], "-N", "500"], "past the context"))
    for argv, message in cases:
        code, out, err = run_cli(capsys, "run", *argv)
        assert code == 2, argv
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err


def test_tui_without_a_terminal_points_to_run(capsys):
    code, out, err = run_cli(capsys)
    assert code == 2 and "specview run" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_real_signal_mid_run_still_ends_cleanly(tiny_dir, tmp_path, sig):
    """A real Ctrl-C (SIGINT) or kill (SIGTERM) to a real process in the middle of a long run: the run's
    end event (marked interrupted), the summary and the profile are still written, with no traceback."""
    import tiny

    path = tiny.save(tiny.make_model("gpt2", 16, 0, n_positions=8192), tiny.make_tokenizer(16), tiny_dir / "long")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specview", "run", "--target", path, "--draft", path, "-N", "8000",
         "--ignore-eos", "--jsonl", "-", "--quiet", "--profile-dir", str(tmp_path / "prof")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # the worst case, always: a background job of a non-interactive shell starts with SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    lines = [proc.stdout.readline() for _ in range(4)]  # start + 3 steps: the run is under way
    proc.send_signal(sig)
    rest, err = proc.communicate(timeout=120)
    events = [json.loads(x) for x in (lines + rest.splitlines()) if x.strip()]
    assert proc.returncode == 130
    assert [e["type"] for e in events].count("end") == 1
    assert events[-1]["type"] == "end" and events[-1]["stop_reason"] == "interrupted"
    assert 3 <= events[-1]["steps"] < 2000
    assert "Traceback" not in err and "tokens/s" in err
    [profile] = [p for p in (tmp_path / "prof").glob("*.json") if p.name.count(".") == 1]
    doc = json.loads(profile.read_text())
    assert doc["summary"]["interrupted"] is True and doc["summary"]["steps"] == events[-1]["steps"]


def test_empty_prompt_starts_from_bos(capsys, models):
    code, out, err = run_cli(capsys, "run", *models, "--prompt", "", "-N", "4", "--jsonl", "-", "--ignore-eos")
    assert code == 0
    assert json.loads(out.splitlines()[0])["prompt_ids"] == [1]  # <s>


def test_empty_prompt_without_bos_exits_2(capsys, tiny_dir):
    import tiny

    tok = tiny.make_tokenizer(16)
    tok.bos_token = None
    path = tiny.save(tiny.make_model("gpt2", 16, 0), tok, tiny_dir / "no-bos")
    capsys.readouterr()
    code, out, err = run_cli(capsys, "run", "--target", path, "--draft", path, "--prompt", "")
    assert code == 2 and "no BOS token" in err and len(err.strip().splitlines()) == 1


def test_chat_without_a_template_exits_2(capsys, models):
    code, out, err = run_cli(capsys, "run", *models, "--chat")
    assert code == 2 and "no chat template" in err


def test_an_unwritable_profile_dir_fails_before_any_model_loads(capsys, models, tmp_path, monkeypatch):
    import specview.session

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(specview.session, "load_model", no_load)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = run_cli(capsys, "run", *models, "--profile-dir", str(blocker / "profiles"))
    assert code == 2 and "--profile-dir: cannot write to" in err and len(err.strip().splitlines()) == 1, err


def test_a_full_disk_during_the_profile_save_leaves_no_partial_file(capsys, models, tmp_path, monkeypatch):
    """ENOSPC in the middle of writing the profile: one line, no half file, and the summary still printed."""
    import errno

    import specview.core.files

    def full_disk(obj, f, **kwargs):
        f.write('{"schema": "specview.profile/1", "ste')  # half a document, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(specview.core.files.json, "dump", full_disk)
    folder = tmp_path / "prof"
    code, out, err = run_cli(capsys, "run", *models, "-N", "6", "--profile-dir", str(folder))
    assert code == 2
    assert "tokens/s" in out  # the summary table
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "No space left on device" in errors[0], err
    assert list(folder.iterdir()) == []  # neither the profile nor a temp file is left


def test_the_console_script_exits_fast_yet_runs_exit_handlers_and_waits_for_threads(tmp_path):
    """cli.entry skips the interpreter's teardown (os._exit) after main: every exit handler must still have run,
    stdout must be flushed whole, and a live non-daemon thread must get the ordinary exit (which waits for it)."""
    script = (
        "import atexit, sys, threading, time\n"
        "from specview.cli import main as cli\n"
        f"atexit.register(lambda: open({str(tmp_path / 'handler')!r}, 'w').write('ran'))\n"
        "if sys.argv[1] == 'thread':\n"
        f"    threading.Thread(target=lambda: (time.sleep(0.2), open({str(tmp_path / 'thread')!r}, 'w').write('done')))"
        ".start()\n"
        "sys.stdout.write('x' * 200000)\n"
        "sys.stdout.write('tail')\n"  # stays in the stream's buffer until a flush
        "sys.argv = ['specview', 'report', 'no-such-file.json']\n"
        "cli.entry()\n")
    for mode in ("plain", "thread"):
        proc = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, HF_HUB_OFFLINE="1"))
        assert proc.returncode == 2, proc.stderr  # main's own code for a missing file
        assert "no-such-file.json" in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stdout == "x" * 200000 + "tail"
        assert (tmp_path / "handler").read_text() == "ran"
        (tmp_path / "handler").unlink()
    assert (tmp_path / "thread").read_text() == "done"


def test_a_profiler_around_the_command_still_gets_to_write_its_results(tmp_path):
    """`python -m cProfile -o FILE -m specview ...` writes FILE after the program returns: under a profiler
    the console script's quick exit gives way to the ordinary one."""
    out = tmp_path / "cli.prof"
    proc = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "specview", "report",
                           "no-such-file.json"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert "no-such-file.json" in proc.stderr  # (cProfile swallows the SystemExit: its own exit code is 0)
    assert out.stat().st_size > 0
