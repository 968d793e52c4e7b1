"""The real llama-server (`make engines`, or SPECVIEW_LLAMA_SERVER=/path/to/llama-server) on the bundled GGUF with
ngram speculation: eval --endpoint's acceptance is its timings summed and a request replayed by hand gets the same
counts, the /metrics deltas agree with the timings, --attach reads it, bench times it. Skipped, with the reason,
where the extra is not built. No timing is asserted."""

import json
import os

import httpx
import pytest

from helpers import run_cli
from specview.core.settings import DEFAULT_TARGET, Settings
from specview.remote import llama_server

NGRAM = ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8", "--spec-ngram-simple-size-n", "3"]


def bundled_gguf() -> str | None:
    from specview.bench.llamacpp import gguf_path

    try:
        path = gguf_path(DEFAULT_TARGET)
    except Exception:  # noqa: BLE001 - the bundled model is not installed: the skip says so
        return None
    return path if path and os.path.exists(path) else None


@pytest.fixture(scope="module")
def server():
    binary = llama_server.find_binary()
    if binary is None:
        pytest.skip(llama_server.NOT_BUILT)
    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("the bundled GGUF is not installed (make install)")
    with llama_server.LlamaServer(binary, gguf, 1, NGRAM) as running:
        yield running


def test_eval_acceptance_is_the_servers_timings_summed_and_replays(server, capsys, tmp_path):
    out = tmp_path / "ev.json"
    code, out_text, err = run_cli(capsys, "eval", "--endpoint", server.url, "--limit", "2", "--categories",
                                  "translation,rag", "-N", "32", "--json", str(out), "--no-plots")
    assert code == 0, err
    doc = json.loads(out.read_text())
    label = doc["config"]["drafters"][0]
    assert label == "llama-server:ngram-simple" and doc["config"]["engine"]["version"]
    assert doc["config"]["chat"] is True  # the bundled model is an instruct model with a template
    assert doc["summary"][label]["overall"]["drafted"] > 0
    for cat, m in doc["summary"][label]["by_category"].items():
        rs = [r for r in doc["results"] if r["category"] == cat]
        t = [r["engine"]["timings"] for r in rs]
        assert m["acceptance_rate"] == (sum(x.get("draft_n_accepted", 0) for x in t) / sum(x.get("draft_n", 0) for x in t)
                                        if sum(x.get("draft_n", 0) for x in t) else None)
    for r in doc["results"]:  # by hand, the request the file keeps: the same counts
        request = r["engine"]["request"]
        again = httpx.post(server.url + request["path"], json=request["body"], timeout=None).json()["timings"]
        assert (again.get("draft_n", 0), again.get("draft_n_accepted", 0)) == (r["drafted"], r["accepted"])
        assert r["engine"]["metrics_delta"]["draft_tokens"] == r["drafted"]  # /metrics agrees with the timings
        assert r["engine"]["metrics_delta"]["accepted"] == r["accepted"]
        assert r["stop"] == "length" or r["stop"] in ("eos", "empty") and "ended before" in " ".join(out_text.split())


def test_attach_reads_the_servers_counters(server):
    from specview.remote.watch import EngineWatch, open_engine

    watch = EngineWatch(open_engine(server.url), Settings(prompt="one two three one two three one two three",
                                                          max_new_tokens=24, temperature=0.0))
    try:
        watch.poll()
        asked = watch.request()
        _, recent = watch.poll()
        assert (recent.drafted, recent.accepted) == (asked.drafted, asked.accepted)
        assert asked.tokens == 24
    finally:
        watch.endpoint.close()


def test_bench_times_the_server_beside_ours(capsys, tmp_path, monkeypatch, server):
    monkeypatch.setenv("SPECVIEW_LLAMA_SERVER", server.binary)
    out = tmp_path / "bench.json"
    code, _, err = run_cli(capsys, "bench", "--peer", "llama-server:ngram-simple", "--draft", "ngram",
                           "--temperature", "0", "-N", "16", "-K", "8", "-R", "1", "--threads", "1",
                           "--no-profile", "--json", str(out))
    assert code == 0, err
    m = json.loads(out.read_text())["methods"]["llama_server_speculative"]
    assert m["runs"][0]["tokens"] == 16 and m["peer"]["spec_type"] == "ngram-simple"
    assert m["drafted"] == sum(r["engine"]["timings"].get("draft_n", 0) for r in m["runs"])
