"""`specview eval --endpoint`: a prompt set against fake engines on a loopback port that answer in llama-server's
and vLLM's documented shapes (tests/support/fake_engines.py). The acceptance per category must be the engine's own
counts summed, the raw counters kept per request, a bad endpoint one line and exit 2. The real llama-server:
tests/remote/test_llama_server.py."""

import json

from fake_engines import drafts_for, fake_engine, free_port, not_http_server

from helpers import run_cli
from specview.core.prompt_sets import BUILTIN, load_prompts

N = 12


def run_eval(capsys, tmp_path, url, *more):
    out = tmp_path / "ev.json"
    code, stdout, stderr = run_cli(capsys, "eval", "--endpoint", url, "--limit", "2", "-N", str(N), "--json",
                                   str(out), "--no-plots", *more)
    return code, stdout, stderr, (json.loads(out.read_text()) if out.exists() else None)


def expected(category: str, limit: int = 2) -> float:
    prompts = [p for p in load_prompts(BUILTIN, limit) if p.category == category]
    counts = [drafts_for(p.text, N) for p in prompts]
    return sum(c[1] for c in counts) / sum(c[0] for c in counts)


def test_llama_server_acceptance_is_its_timings_summed(capsys, tmp_path):
    with fake_engine("llama-server") as (engine, url), fake_engine("openai") as (base, base_url):
        code, stdout, _, doc = run_eval(capsys, tmp_path, url, "--baseline-endpoint", base_url)
    assert code == 0
    label = "llama-server:ngram-simple"
    assert doc["schema"] == "specview.eval/1" and doc["complete"]
    c = doc["config"]
    assert c["engine"]["kind"] == "llama-server" and c["engine"]["version"] == "b9999-fake"
    assert c["drafters"] == [label] and c["engine"]["spec_types"] == "ngram-simple" and c["target"] == "fake.gguf"
    assert c["baseline_endpoint"] == base_url
    by_cat = doc["summary"][label]["by_category"]
    assert set(by_cat) == {"conversation", "translation", "summarization", "qa", "math", "rag"}
    for cat, m in by_cat.items():
        assert m["acceptance_rate"] == expected(cat)  # exactly: the same integer sums
        assert m["speedup_mean_of_prompts"] is not None and m["same_tokens_failures"] == []
    spec = [r for r in doc["results"] if r["method"] == "speculative"]
    for r in spec:  # the raw counters as the engine said them, and what was read from them
        t = r["engine"]["timings"]
        assert (r["drafted"], r["accepted"]) == (t["draft_n"], t["draft_n_accepted"])
        assert r["steps"] == r["tokens"] - r["accepted"] and r["tokens"] == t["predicted_n"] == N
        assert r["drafts"] == r["engine"]["metrics_delta"]["drafts"]
    # per position from /metrics: accepted at i over verification steps
    m = doc["summary"][label]["overall"]
    per_pos = [sum(r["accepted_per_position"][i] for r in spec) / sum(r["drafts"] for r in spec) for i in range(4)]
    assert m["per_position_acceptance"] == per_pos and m["alpha"] is None
    bodies = [b for path, b in engine.requests if path == "/completion"]
    assert len(bodies) == 1 + 12  # the warm-up, then one request per prompt
    assert all(b["temperature"] == 0 and b["cache_prompt"] is False and b["n_predict"] == N for b in bodies[1:])
    assert "llama-server b9999-fake" in stdout


def test_vllm_acceptance_from_metric_deltas_without_baseline(capsys, tmp_path):
    with fake_engine("vllm") as (engine, url):
        code, stdout, _, doc = run_eval(capsys, tmp_path, url, "--categories", "qa,math")
    assert code == 0
    label = "vllm"
    assert doc["config"]["engine"]["kind"] == "vllm" and doc["config"]["drafters"] == [label]
    for cat in ("qa", "math"):
        m = doc["summary"][label]["by_category"][cat]
        assert m["acceptance_rate"] == expected(cat)
        assert m["speedup_mean_of_prompts"] is None and m["tokens_per_s"] > 0  # no baseline: tokens/s only
    sent = [(path, body) for path, body in engine.requests if path != "/tokenize"]  # /tokenize: a template?
    assert all(path == "/v1/completions" and body["ignore_eos"] is True for path, body in sent)
    assert "no --baseline-endpoint: tokens/s only" in stdout.replace("\n", " ")
    assert all(r["stop"] == "length" and r["tokens"] == N for r in doc["results"])
    assert "prompts as written, ignore_eos (N tokens each)" in " ".join(stdout.split())


def test_an_instruct_model_gets_its_chat_template_and_n_tokens(capsys, tmp_path):
    """The defaults give N tokens per prompt: where the server has a chat template the builtin prompts go through
    it (the fake, like SmolLM2-Instruct, answers a raw first turn with end-of-sequence at once)."""
    for kind in ("vllm", "llama-server"):
        with fake_engine(kind, template=True) as (engine, url):
            code, stdout, _, doc = run_eval(capsys, tmp_path, url, "--categories", "qa")
        assert code == 0
        assert doc["config"]["chat"] is True and doc["config"]["ignore_eos"] is False
        assert [p for p, _ in engine.requests if p.startswith("/v1/")] == ["/v1/chat/completions"] * 3
        assert all(r["stop"] == "length" and r["tokens"] == N for r in doc["results"])
        assert "prompts through the server's chat template" in " ".join(stdout.split())
        assert "ended before" not in stdout


def test_requests_that_end_early_are_marked_counted_and_warned(capsys, tmp_path):
    # --no-chat on an instruct model: ignore_eos keeps N tokens
    with fake_engine("vllm", template=True) as (engine, url):
        code, _, _, doc = run_eval(capsys, tmp_path, url, "--categories", "qa", "--no-chat")
    assert code == 0 and all(r["stop"] == "length" and r["tokens"] == N for r in doc["results"])
    assert all(body["ignore_eos"] is True for path, body in engine.requests if path == "/v1/completions")
    # answers that end after 5 tokens: marked in the JSON, counted per category, warned about
    with fake_engine("vllm", template=True, eos_after=5) as (engine, url):
        code, stdout, _, doc = run_eval(capsys, tmp_path, url, "--categories", "qa,math")
    assert code == 0
    assert all(r["stop"] == "eos" and r["tokens"] == 5 for r in doc["results"])
    assert all(r["engine"]["finish_reason"] == "stop" for r in doc["results"])
    summary = doc["summary"]["vllm"]
    assert summary["overall"]["early_stops"] == 4 and summary["by_category"]["qa"]["early_stops"] == 2
    flat = " ".join(stdout.split())
    assert "ended" in stdout.split("per category")[1].split("\n")[2]  # the table's column of early ends
    assert "4 of 4 requests ended before N=12 tokens" in flat and "qa 2, math 2" in flat
    assert "cover those few tokens only" in flat


def test_an_empty_answer_is_an_early_end():
    """A raw first turn sent to an instruct model without ignore_eos (what --attach and eval no longer do by
    default): one token, an empty text."""
    from specview.core.settings import Settings
    from specview.remote.endpoint import EMPTY, EOS, LENGTH, ended, probe

    assert (ended("", 32, 32), ended(" \n", 1, 32), ended("a b", 2, 32), ended("a b", 32, 32)) == (EMPTY, EMPTY, EOS,
                                                                                                  LENGTH)
    for kind in ("vllm", "llama-server"):
        with fake_engine(kind, template=True) as (_, url):
            endpoint = probe(url, need_speculation=True)
            try:
                done = endpoint.complete("What is two plus two?", Settings(max_new_tokens=N, temperature=0.0))
            finally:
                endpoint.close()
        assert (done.stop, done.tokens, done.text, done.early) == (EMPTY, 1, "", True)


def test_resume_sends_only_the_missing_prompts(capsys, tmp_path):
    with fake_engine("llama-server") as (engine, url):
        code, _, _, doc = run_eval(capsys, tmp_path, url, "--categories", "qa")
        assert code == 0
        whole = doc["summary"]["llama-server:ngram-simple"]["overall"]
        doc["results"] = doc["results"][:1]  # as if stopped after the first prompt
        (tmp_path / "ev.json").write_text(json.dumps(doc))
        sent = len(engine.requests)
        code, _, _, again = run_eval(capsys, tmp_path, url, "--categories", "qa", "--resume",
                                     str(tmp_path / "ev.json"))
    assert code == 0 and again["meta"]["resumed_results"] == 1
    assert len(engine.requests) - sent == 2  # the warm-up and the one missing prompt
    resumed = again["summary"]["llama-server:ngram-simple"]["overall"]
    assert (resumed["drafted"], resumed["accepted"]) == (whole["drafted"], whole["accepted"])


def test_bad_endpoints_are_one_line_and_exit_2(capsys, tmp_path):
    cases = []
    cases.append((f"http://127.0.0.1:{free_port()}", "connection refused"))
    with not_http_server() as url:
        cases.append((url, "is not an HTTP server"))
        code, _, err, _ = run_eval(capsys, tmp_path, url)
        assert code == 2 and "is not an HTTP server" in err and len(err.strip().splitlines()) == 1
    with fake_engine("html") as (_, url):
        code, _, err, _ = run_eval(capsys, tmp_path, url)
        assert code == 2 and "not an OpenAI-compatible server" in err and len(err.strip().splitlines()) == 1
    with fake_engine("llama-server", speculative=False) as (_, url):
        code, _, err, _ = run_eval(capsys, tmp_path, url)
        assert code == 2 and "does not speculate" in err and len(err.strip().splitlines()) == 1
    with fake_engine("vllm", speculative=False) as (_, url):
        code, _, err, _ = run_eval(capsys, tmp_path, url)
        assert code == 2 and "no spec_decode counters" in err and len(err.strip().splitlines()) == 1
    with fake_engine("openai") as (_, url):
        code, _, err, _ = run_eval(capsys, tmp_path, url)
        assert code == 2 and "reports no speculation" in err and len(err.strip().splitlines()) == 1
    code, _, err, _ = run_eval(capsys, tmp_path, cases[0][0])
    assert code == 2 and "connection refused" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "eval", "--baseline-endpoint", cases[0][0])
    assert code == 2 and "give --endpoint too" in err


def test_report_shows_an_endpoint_eval_and_compares_it(capsys, tmp_path):
    with fake_engine("llama-server") as (_, url):
        code, _, _, doc = run_eval(capsys, tmp_path, url, "--categories", "math")
    assert code == 0
    code, out, _ = run_cli(capsys, "report", str(tmp_path / "ev.json"))
    flat = "".join(out.split())
    assert code == 0 and "enginellama-serverb9999-fake" in flat and "(timings.draft_n)" in flat
    code, out, _ = run_cli(capsys, "report", str(tmp_path / "ev.json"), str(tmp_path / "ev.json"))
    assert code == 0 and "A: llama-server" in out and "B: llama-server" in out


def test_json_alone_prints_the_document_on_stdout(capsys, tmp_path):
    with fake_engine("llama-server") as (_, url):
        code, stdout, err = run_cli(capsys, "eval", "--endpoint", url, "--limit", "1", "--categories", "qa", "-N",
                                    str(N), "--no-plots", "--profile-dir", str(tmp_path), "--json")
    assert code == 0
    doc = json.loads(stdout)  # nothing else on stdout
    assert doc["summary"]["llama-server:ngram-simple"]["overall"]["acceptance_rate"] == expected("qa", 1)
    assert "per category" in err and "results written" in err
