"""`specview eval`: the prompt parsers and filters, the metrics on hand-computed steps, the JSON contract,
resume, bad input (one line, exit 2, before any model loads), report and plots. Tiny models only; no
timing is asserted."""

import json
import math
import os
import signal
import subprocess
import sys
import threading

import pytest

from helpers import run_cli
from specview.core.errors import SpecviewError
from specview.core.metrics import Counts, expected_tokens_per_step, speedups_over_baseline
from specview.core.prompt_sets import BUILTIN, load_prompts
from specview.eval.summary import group_metrics, summarize

BUILTIN_CATEGORIES = ["conversation", "translation", "summarization", "qa", "math", "rag"]


# --- prompt sets -----------------------------------------------------------------------------------


def test_builtin_set_has_six_categories_of_at_least_eight():
    prompts = load_prompts(BUILTIN)
    cats = list(dict.fromkeys(p.category for p in prompts))
    assert cats == BUILTIN_CATEGORIES
    assert all(sum(p.category == c for p in prompts) >= 8 for c in cats)
    assert len({p.id for p in prompts}) == len(prompts)
    rag = [p for p in prompts if p.category == "rag"]
    assert all("Passage:" in p.text and "Question:" in p.text for p in rag)  # a passage, then a question on it


def test_spec_bench_question_jsonl_first_turn(tmp_path):
    path = tmp_path / "question.jsonl"
    lines = [{"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now rewrite it."]},
             {"question_id": 82, "category": "translation", "turns": ["Translate: Hallo Welt"]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    prompts = load_prompts(str(path))
    assert [(p.id, p.category, p.text) for p in prompts] == [("81", "writing", "Write a haiku."),
                                                             ("82", "translation", "Translate: Hallo Welt")]


def test_prompt_category_jsonl_and_text_file(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text('{"prompt": "a b", "category": "x"}\n{"prompt": "c"}\n{"id": "z", "prompt": "d", "category": "y"}\n')
    prompts = load_prompts(str(path))
    assert [(p.id, p.category, p.text) for p in prompts] == [("1", "x", "a b"), ("2", "default", "c"), ("z", "y", "d")]
    text = tmp_path / "prompts.txt"
    text.write_text("first prompt\n\n  second prompt  \n")
    prompts = load_prompts(str(text))
    assert [(p.id, p.category, p.text) for p in prompts] == [("1", "default", "first prompt"),
                                                             ("3", "default", "second prompt")]


def test_limit_per_category_and_categories_filter():
    prompts = load_prompts(BUILTIN, limit=2, categories=["math", "qa"])
    assert [p.id for p in prompts] == ["qa-1", "qa-2", "math-1", "math-2"]  # the set's order, first two of each
    assert len(load_prompts(BUILTIN, limit=1)) == 6


@pytest.mark.parametrize("content, name, message", [
    (None, "missing.jsonl", "no such file"),
    ("", "empty.jsonl", "is empty"),
    ("  \n\n", "blank.txt", "is empty"),
    ('{"prompt": "ok"}\n{"prompt": "x",\n', "bad.jsonl", "line 2: not JSON"),
    ('{"prompt": "ok"}\n\n{"text": "x"}\n', "bad.jsonl", "line 3: no \"prompt\" or \"turns\" field"),
    ('{"turns": []}\n', "bad.jsonl", "line 1: \"turns\" must be a non-empty list"),
    ('[1, 2]\n', "bad.jsonl", "line 1: a JSON list"),
    ('null\n', "bad.jsonl", "line 1: a JSON null, not an object"),
    # past json's own limits: these raised ValueError and RecursionError with a traceback
    ('{"prompt": "a", "id": 1' + "0" * 5000 + '}\n', "bad.jsonl", "line 1: not JSON specview reads"),
    ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + '}\n', "bad.jsonl", "line 1: not JSON specview reads"),
    ('{"prompt": "  "}\n', "bad.jsonl", "line 1: the prompt is empty"),
    ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', "bad.jsonl", "line 2: id '1' is already used on line 1"),
])
def test_bad_prompt_files(tmp_path, content, name, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(SpecviewError, match=message.replace("[", r"\[")) as err:
        load_prompts(str(path))
    assert "\n" not in str(err.value)


def test_unknown_category_names_the_known_ones():
    with pytest.raises(SpecviewError, match="unknown category 'poetry'; this set has conversation, translation"):
        load_prompts(BUILTIN, categories=["qa", "poetry"])


# --- metrics on hand-computed steps ------------------------------------------------------------------

# K = 3. (drafted, accepted) per step: all accepted; rejected at 1; rejected at 0; a block cut short by N
# with both accepted; an n-gram miss (nothing drafted: a plain target step).
STEPS = [(3, 3), (3, 1), (3, 0), (2, 2), (0, 0)]


def test_counts_histogram_and_conditional_acceptance():
    c = Counts()
    for d, a in STEPS:
        c.count(d, a, a < d, a + 1)
    assert (c.steps, c.drafted, c.accepted, c.rejections, c.emitted) == (5, 11, 6, 2, 11)
    assert c.acceptance_rate == 6 / 11 and c.alpha == 6 / 8 and c.mean_emitted_per_step == 11 / 5
    assert c.per_position_acceptance == [3 / 4, 2 / 4, 1 / 3]
    # position 2 was reached (position 1 accepted) in 3 of the 4 steps that drafted it; position 3 in one
    assert c.conditional_position_acceptance == [3 / 4, 2 / 3, 1 / 1]
    assert c.accepted_length_histogram(3) == [1, 1, 1, 1] and c.accepted_length_histogram(5) == [1, 1, 1, 1, 0, 0]
    merged = Counts()
    merged.merge(c)
    merged.merge(c)
    assert merged.accepted_length_counts == [2, 2, 2, 2] and merged.per_position_reached == [8, 6, 2]
    assert merged.conditional_position_acceptance == c.conditional_position_acceptance


def test_speedup_mean_of_prompts_differs_from_total_time():
    # prompt A twice as fast, prompt B twice as slow: the mean of ratios says 1.25x, total time says 1.0x
    mean, total = speedups_over_baseline([(10, 2.0, 10, 1.0), (10, 1.0, 10, 2.0)])
    assert mean == pytest.approx(1.25) and total == pytest.approx(1.0)
    # different lengths (EOS, sampling): ratios of tokens/s
    mean, total = speedups_over_baseline([(10, 1.0, 20, 1.0)])
    assert mean == total == pytest.approx(2.0)
    assert speedups_over_baseline([]) == (None, None)


def _result(prompt_id, method, drafter, steps, tokens, wall_s, phases, same=None):
    spec = method == "speculative"
    return {"prompt_id": prompt_id, "method": method, "drafter": drafter, "tokens": tokens, "steps": len(steps) if spec else tokens,
            "wall_s": wall_s, "prefill_ms": 0.0, "accepted_lengths": [a for _, a in steps] if spec else [],
            "drafted_lengths": [d for d, _ in steps] if spec else [], "drafted": sum(d for d, _ in steps),
            "accepted": sum(a for _, a in steps), "phases_ms": phases, "same_tokens": same}


def test_group_metrics_exact_numbers():
    ar = _result("p", "autoregressive", None, [], 11, 2.2, {"verify": 110.0})  # t_ar = 10 ms
    spec = _result("p", "speculative", "d", STEPS, 11, 1.1, {"draft": 22.0, "verify": 60.0}, same=True)
    m = group_metrics([spec], {"p": ar}, k=3)
    assert m["acceptance_rate"] == pytest.approx(6 / 11) and m["alpha"] == pytest.approx(0.75)
    assert m["mean_accepted_tokens"] == pytest.approx(2.2)
    assert m["accepted_length_histogram"] == [1, 1, 1, 1] and m["undrafted_steps"] == 1
    assert m["per_position_acceptance"] == pytest.approx([0.75, 0.5, 1 / 3])
    assert m["conditional_position_acceptance"] == pytest.approx([0.75, 2 / 3, 1.0])
    assert m["cost_ratio"] == pytest.approx(0.2) and m["verify_cost_ratio"] == pytest.approx(1.2)  # 2 ms/draft, 12 ms/verify
    e_k = (1 - 0.75 ** 4) / 0.25
    assert m["expected_tokens_per_step"] == pytest.approx(e_k) == expected_tokens_per_step(0.75, 3)
    assert m["predicted_speedup"] == pytest.approx(e_k / (3 * 0.2 + 1.2))
    assert m["speedup_mean_of_prompts"] == pytest.approx(2.0) == m["speedup_total_time"]
    assert m["tokens_per_s"] == pytest.approx(10.0) and m["same_tokens_failures"] == []


def test_summarize_by_category_and_failures():
    doc = {"config": {"k": 3, "drafters": ["d"]},
           "prompts": [{"id": "1", "category": "a"}, {"id": "2", "category": "b"}, {"id": "3", "category": "b"}],
           "results": [_result("1", "autoregressive", None, [], 10, 2.0, {"verify": 100.0}),
                       _result("1", "speculative", "d", [(3, 3), (3, 3)], 10, 1.0, {}, same=True),
                       _result("2", "autoregressive", None, [], 10, 1.0, {"verify": 100.0}),
                       _result("2", "speculative", "d", [(3, 0)] * 10, 10, 2.0, {}, same=False)]}
    s = summarize(doc)
    assert list(s) == ["autoregressive", "d"]
    assert list(s["d"]["by_category"]) == ["a", "b"]  # prompt 3 has no results yet: nothing for it
    assert s["d"]["by_category"]["a"]["speedup_mean_of_prompts"] == pytest.approx(2.0)
    assert s["d"]["by_category"]["b"]["acceptance_rate"] == 0.0
    overall = s["d"]["overall"]
    assert overall["speedup_mean_of_prompts"] == pytest.approx(1.25) and overall["speedup_total_time"] == pytest.approx(1.0)
    assert overall["same_tokens_failures"] == ["2"] and overall["accepted_length_histogram"] == [10, 0, 0, 2]
    assert s["autoregressive"]["overall"]["tokens_per_s"] == pytest.approx(20 / 3)
    assert "NaN" not in json.dumps(s)


def test_summary_of_sampled_results_has_no_token_check():
    doc = {"config": {"k": 1, "drafters": ["d"]}, "prompts": [{"id": "1", "category": "a"}],
           "results": [_result("1", "speculative", "d", [(1, 1)], 2, 1.0, {}, same=None)]}
    overall = summarize(doc)["d"]["overall"]
    assert overall["same_tokens_failures"] is None and overall["speedup_total_time"] is None  # no baseline: n/a
    assert not math.isnan(overall["acceptance_rate"])


def test_eval_help_loads_no_torch():
    code = ("import sys, contextlib, io\nfrom specview.cli.main import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['eval', '--help'])\n"
            "print(sorted(m for m in ('torch', 'transformers', 'textual', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- end to end on tiny models ----------------------------------------------------------------------

PROMPTS = [("w1 w2 w3", "a"), ("w4 w5 w4 w5 w4", "b"), ("w6 w7", "b"), ("w8 w9 w8", "c")]


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in PROMPTS))
    return str(path)


@pytest.fixture
def eval_argv(gpt2_paths, prompt_file):
    return ["eval", "--target", gpt2_paths[0], "--draft", f"{gpt2_paths[1]},ngram", "--prompts", prompt_file,
            "-N", "10", "-K", "3", "--ignore-eos"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, gpt2_paths):
    """One whole eval, shared by the tests that only read its outputs."""
    folder = tmp_path_factory.mktemp("eval")
    prompts = folder / "set.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in PROMPTS))
    out = folder / "run.json"
    argv = ["eval", "--target", gpt2_paths[0], "--draft", f"{gpt2_paths[1]},ngram", "--prompts", str(prompts),
            "-N", "10", "-K", "3", "--ignore-eos", "--json", str(out)]
    capsys = _Capture()
    code = _main(argv, capsys)
    return code, capsys, out, argv


class _Capture:  # the module fixture cannot use capsys: capture stdout/stderr by hand
    out = err = ""


def _main(argv, cap):
    import contextlib
    import io

    from specview.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    cap.out, cap.err = out.getvalue(), err.getvalue()
    return code


def test_eval_end_to_end_json_contract(finished):
    code, cap, out, _ = finished
    assert code == 0, cap.err
    doc = json.loads(out.read_text())
    assert doc["schema"] == "specview.eval/1" and doc["complete"] and not doc["interrupted"]
    assert doc["config"]["drafters"][1] == "ngram" and doc["config"]["temperature"] == 0.0  # eval is greedy by default
    assert [p["category"] for p in doc["prompts"]] == ["a", "b", "b", "c"]
    assert all(p["prompt_tokens"] == len(text.split()) for p, (text, _) in zip(doc["prompts"], PROMPTS))
    assert len(doc["results"]) == 4 * 3
    for r in doc["results"]:
        assert {"prompt_id", "method", "drafter", "tokens", "steps", "wall_s", "accepted_lengths", "drafted",
                "accepted", "same_tokens"} <= set(r)
        assert r["tokens"] == 10
        if r["method"] == "speculative":
            assert r["same_tokens"] is True  # greedy: every drafter emits the target's own tokens
            assert sum(r["accepted_lengths"]) == r["accepted"] and sum(r["drafted_lengths"]) == r["drafted"]
            assert len(r["accepted_lengths"]) == r["steps"]
            assert sum(r["accepted_lengths"]) + r["steps"] == r["tokens"]  # each step adds one target token
        else:
            assert r["drafter"] is None and r["same_tokens"] is None and r["accepted_lengths"] == []
    summary = doc["summary"]
    assert list(summary) == ["autoregressive", doc["config"]["drafters"][0], "ngram"]
    for spec in doc["config"]["drafters"]:
        assert list(summary[spec]["by_category"]) == ["a", "b", "c"]
        m = summary[spec]["overall"]
        for key in ("acceptance_rate", "alpha", "mean_accepted_tokens", "accepted_length_histogram",
                    "per_position_acceptance", "conditional_position_acceptance", "tokens_per_s",
                    "speedup_mean_of_prompts", "speedup_total_time", "predicted_speedup"):
            assert key in m, key
        assert len(m["accepted_length_histogram"]) == 4 and len(m["per_position_acceptance"]) == 3
        assert m["same_tokens_failures"] == []
        steps = [r for r in doc["results"] if r["drafter"] == spec]
        assert m["mean_accepted_tokens"] == pytest.approx(40 / sum(r["steps"] for r in steps))
    assert "NaN" not in out.read_text()
    t = doc["meta"]["timing"]
    assert 0 <= t["overhead_s"] <= t["loop_s"] and t["runs_s"] > 0


def test_eval_prints_table_plots_and_writes_plot_files(finished):
    code, cap, out, _ = finished
    assert "per category" in cap.out and "ngram" in cap.out and "speedup" in cap.out
    assert "acceptance rate by category" in cap.out and "accepted length per drafting step" in cap.out
    png, svg = str(out)[:-5] + ".png", str(out)[:-5] + ".svg"
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and "<svg" in open(svg).read(2000)
    assert f"results written: {out}" in cap.err and png in cap.err


def test_report_renders_and_compares_evals(capsys, finished):
    _, _, out, _ = finished
    code, text, err = run_cli(capsys, "report", str(out))
    assert code == 0, err
    assert "per category" in text and "given i-1 accepted" in text and "ngram" in text
    code, text, err = run_cli(capsys, "report", str(out), str(out))
    assert code == 0, err
    assert "A: " in text and "B: " in text and "same settings" in text and "speedup, total time" in text


def test_a_real_sigint_stops_after_the_current_prompt_then_resumes(gpt2_paths, tmp_path, capsys):
    """A real `specview eval` process, SIGINT once its file shows a finished prompt: the prompt in flight still
    finishes, the file holds whole prompts and says interrupted, exit 130; --resume runs the rest and carries
    the finished ones over. The child starts in its own session with SIGINT ignored, so neither the terminal
    (CI has none) nor the disposition this test inherits matters: eval installs its own handlers."""
    prompts = tmp_path / "set.jsonl"
    many = [(f"w{i % 9 + 1} w{i * 4 % 9 + 1} w{i * 7 % 9 + 1}", "abc"[i % 3]) for i in range(SIGNAL_PROMPTS)]
    prompts.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in many))
    out = tmp_path / "e.json"
    argv = ["eval", "--target", gpt2_paths[0], "--draft", f"{gpt2_paths[1]},ngram", "--prompts", str(prompts),
            "-N", "10", "-K", "3", "--ignore-eos", "--no-plots", "--json", str(out)]
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "specview", *argv], stdout=stdout, stderr=stderr,
                                env=dict(os.environ, HF_HUB_OFFLINE="1"), start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            finished = _wait_for_results(out, proc)  # written atomically after every prompt: whole or absent
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = (tmp_path / "stderr").read_text()
    assert code == 130, err
    doc = json.loads(out.read_text())
    done = sorted({r["prompt_id"] for r in doc["results"]}, key=int)
    assert doc["interrupted"] and not doc["complete"]
    assert finished <= len(done) < SIGNAL_PROMPTS and len(doc["results"]) == 3 * len(done)  # whole prompts
    assert done == [str(i) for i in range(1, len(done) + 1)]  # in order, none skipped
    assert "--resume" in err and "Traceback" not in err
    code, text, err = run_cli(capsys, *argv, "--resume", str(out))
    assert code == 0, err
    resumed = json.loads(out.read_text())
    assert resumed["complete"] and not resumed["interrupted"]
    assert resumed["meta"]["resumed_results"] == len(doc["results"])
    assert resumed["results"][: len(doc["results"])] == doc["results"]  # carried over as they were
    assert len({r["prompt_id"] for r in resumed["results"]}) == SIGNAL_PROMPTS


SIGNAL_PROMPTS = 24  # the signal lands after the first finished prompt (~0.15 s each here): the rest is room to spare


def _wait_for_results(path, proc, timeout: float = 120.0) -> int:
    """Poll the eval file until it holds a finished prompt -> how many it holds (an observable state)."""
    pause = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if proc.poll() is not None:
            raise AssertionError(f"eval ended (exit {proc.returncode}) before the test could signal it")
        if path.exists():
            done = {r["prompt_id"] for r in json.loads(path.read_text())["results"]}
            if done:
                return len(done)
        pause.wait(0.01)
    raise AssertionError("no finished prompt in the eval file in time")


# --- bad input: one line, exit 2, before any model loads ----------------------------------------------


@pytest.fixture
def no_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("models loaded before the input was checked")

    monkeypatch.setattr("specview.session.open_session", refuse)


def _one_line_error(code, err, *needles):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("specview eval: error:")
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("content, name, needle", [
    (None, "gone.jsonl", "no such file"),
    ("", "empty.txt", "is empty"),
    ('{"prompt": "a"}\nnot json\n', "bad.jsonl", "line 2: not JSON"),
    ('{"question_id": 1, "category": "x"}\n', "bad.jsonl", "line 1: no \"prompt\" or \"turns\""),
])
def test_bad_prompt_file_exits_2_before_load(capsys, tmp_path, no_load, content, name, needle):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    code, _, err = run_cli(capsys, "eval", "--prompts", str(path))
    _one_line_error(code, err, needle)


@pytest.mark.parametrize("argv, needle", [
    (["--categories", "qa,poems"], "unknown category 'poems'"),
    (["--categories", ""], "--categories needs"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--draft", "ngram,ngram"], "twice"),
    (["--resume", "/nonexistent/e.json"], "no such file"),
    (["--prompt", "hello"], "--prompts"),
    (["--json", "/proc/no-such-folder/e.json"], "--json: cannot write"),
])
def test_bad_options_exit_2_before_load(capsys, no_load, argv, needle):
    code, _, err = run_cli(capsys, "eval", *argv)
    _one_line_error(code, err, needle)


def test_resume_refuses_another_config_naming_the_field(capsys, finished, no_load):
    _, _, out, argv = finished
    code, _, err = run_cli(capsys, *argv[:-2], "--resume", str(out), "--temperature", "0.7")
    _one_line_error(code, err, "temperature 0.0", "0.7")
    code, _, err = run_cli(capsys, *argv[:-2], "--resume", str(out), "--limit", "1")
    _one_line_error(code, err, "another prompt set")


def test_resume_refuses_a_profile_or_bench_file(capsys, tmp_path, no_load):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema": "specview.bench/1", "methods": {}}))
    code, _, err = run_cli(capsys, "eval", "--resume", str(path))
    _one_line_error(code, err, "not an eval")


def test_eval_defaults():
    from specview.eval.options import build_eval_parser

    args = build_eval_parser().parse_args([])
    assert (args.temperature, args.draft, args.chat, args.prompts, args.prompt) == \
        (0.0, "smollm2-135m@int4+head,ngram", None, "builtin", None)
    assert build_eval_parser().parse_args(["--no-chat"]).chat is False
    assert build_eval_parser().parse_args(["--chat"]).chat is True


def test_sampled_eval_resumes_to_the_same_tokens(capsys, eval_argv, tmp_path, monkeypatch):
    """Sampling: no token check, and each prompt's draws are seeded by its place in the set, so an eval
    stopped after the first prompt and resumed samples exactly what an uninterrupted one does."""
    from specview.bench.methods import EngineMethod

    argv = [*eval_argv, "--temperature", "1", "--no-plots"]
    whole = tmp_path / "whole.json"
    code, _, err = run_cli(capsys, *argv, "--json", str(whole))
    assert code == 0, err
    doc = json.loads(whole.read_text())
    assert all(r["same_tokens"] is None for r in doc["results"])
    assert doc["summary"]["ngram"]["overall"]["same_tokens_failures"] is None

    real_run, calls = EngineMethod.run, []

    def stop_in_first_prompt(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3 + 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(EngineMethod, "run", stop_in_first_prompt)
    part = tmp_path / "part.json"
    code, _, err = run_cli(capsys, *argv, "--json", str(part))
    assert code == 130 and len(json.loads(part.read_text())["results"]) == 3
    monkeypatch.setattr(EngineMethod, "run", real_run)
    code, _, err = run_cli(capsys, *argv, "--resume", str(part))
    assert code == 0, err

    def tokens(d):
        return [(r["prompt_id"], r["drafter"], r["generated_ids"]) for r in d["results"]]

    assert tokens(json.loads(part.read_text())) == tokens(doc)
    assert len({tuple(r["generated_ids"]) for r in doc["results"] if r["method"] == "autoregressive"}) > 1


def test_text_prompt_file_and_a_complete_resume(capsys, gpt2_paths, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2\nw3 w4 w3\n")
    out = tmp_path / "e.json"
    argv = ["eval", "--target", gpt2_paths[0], "--draft", "ngram", "--prompts", str(prompts), "-N", "6",
            "--no-plots", "--json", str(out)]
    code, text, err = run_cli(capsys, *argv)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert [p["category"] for p in doc["prompts"]] == ["default", "default"] and doc["config"]["chat"] is False
    code, text, err = run_cli(capsys, *argv[:-2], "--resume", str(out))  # nothing left to run: shown again
    assert code == 0, err
    assert json.loads(out.read_text())["results"] == doc["results"] and "2 of 2 done" in text


def test_terminal_plots_in_colour_and_without(finished):
    from specview.eval.plots import terminal_plots

    doc = json.loads(finished[2].read_text())
    coloured, plain = terminal_plots(doc, color=True), terminal_plots(doc, color=False)
    assert len(coloured) == len(plain) == 3
    assert all(t.spans and "\x1b" not in t.plain for t in coloured)  # ANSI turned into rich styles
    assert all(not t.spans and "▒" in t.plain for t in plain)  # the second series' own fill character


def test_eval_runs_each_policy_side_by_side_and_resumes_only_the_same_list(capsys, gpt2_paths, tmp_path):
    """--draft-policy fixed,p-min=0.1: each drafter under each policy, greedy-equal to autoregressive; the
    summary keys the first policy by the drafter's spec (as before) and the others `spec [policy]`; the
    tables and plots show every variant; a resume with another list is refused, naming the field."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3\nw4 w5 w4 w5\n")
    out = tmp_path / "e.json"
    argv = ["eval", "--target", gpt2_paths[0], "--draft", f"{gpt2_paths[1]},ngram", "--prompts", str(prompts),
            "-N", "8", "-K", "3", "--ignore-eos", "--draft-policy", "fixed,p-min=0.1"]
    code, text, err = run_cli(capsys, *argv, "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    model = gpt2_paths[1]
    assert doc["config"]["policies"] == ["fixed", "p-min=0.1"] and doc["config"]["draft_policy"] == "fixed,p-min=0.1"
    assert len(doc["results"]) == 2 * (1 + 2 * 2)
    spec = [r for r in doc["results"] if r["method"] == "speculative"]
    assert {(r["drafter"], r["policy"]) for r in spec} == {(d, p) for d in (model, "ngram") for p in ("fixed", "p-min=0.1")}
    assert all(r["same_tokens"] is True for r in spec)  # lossless under every policy
    labels = [model, f"{model} [p-min=0.1]", "ngram", "ngram [p-min=0.1]"]
    assert list(doc["summary"]) == ["autoregressive", *labels]
    assert doc["summary"][f"{model} [p-min=0.1]"]["policy"] == "p-min=0.1"
    cut = [r for r in spec if r["policy"] == "p-min=0.1" and r["drafter"] == model]
    assert sum(sum(r["drafted_lengths"]) for r in cut) < sum(3 * r["steps"] for r in cut)  # p-min drafted less
    m = doc["summary"][f"{model} [p-min=0.1]"]["overall"]
    assert m["drafted_per_step"] < 3 and len(m["per_position_acceptance"]) == 3
    assert "ngram [p-min=0.1]" in text and "draft policies fixed, p-min=0.1" in text
    code, _, err = run_cli(capsys, *argv[:-2], "--draft-policy", "fixed", "--resume", str(out), "--no-plots")
    _one_line_error(code, err, "draft_policy 'fixed,p-min=0.1'")
