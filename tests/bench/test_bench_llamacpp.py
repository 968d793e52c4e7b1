"""`specview bench --peer llamacpp`: llama.cpp on the target's GGUF file as a peer. Without llama-cpp-python
(an optional extra) the peer is skipped with one line and bench goes on; with it (importorskip), a real run
on a tiny GGUF fills the bench document's fields and the tables. No timing is asserted, and llama.cpp's
tokens are compared with ours but never required equal (other kernels)."""

import json
import math
import sys

import pytest
import torch

from helpers import run_cli
from specview.bench import llamacpp
from specview.bench.harness import planned_ks
from specview.bench.options import build_bench_parser
from specview.core.settings import Settings
from specview.core.stopping import Stop
from specview.session import open_session
from tiny import write_tiny_gguf

SKIP_NOT_INSTALLED = ('peer llamacpp skipped: llama-cpp-python is not installed (pip install -e ".[llamacpp]" '
                      'or make bench-llamacpp)')


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def no_llama_cpp(monkeypatch):
    """llama-cpp-python absent, honestly: `import llama_cpp` raises ImportError whether or not it is installed."""
    for name in [m for m in sys.modules if m == "llama_cpp" or m.startswith("llama_cpp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)


def _bench(capsys, tmp_path, target, *argv):
    out_json = tmp_path / "bench.json"
    code, out, err = run_cli(capsys, "bench", "--target", target, "--prompt", "the theme the theme", "-N", "8",
                             "--num-runs", "1", "--temperature", "0", "--no-profile", "--json", str(out_json), *argv)
    assert code == 0, err
    return json.loads(out_json.read_text()), out, err


def test_peer_takes_a_list():
    parser = build_bench_parser()
    assert parser.parse_args(["--peer", "hf"]).peer == "hf"  # unchanged for --peer hf (config.peer)
    assert parser.parse_args(["--peer", "llamacpp"]).peer == "llamacpp"
    assert parser.parse_args(["--peer", "llamacpp, hf"]).peer == "llamacpp,hf"
    assert parser.parse_args(["--peer", "hf,hf"]).peer == "hf"


@pytest.mark.parametrize("value", ["vllm:bogus", "", "hf,", "hf,,llamacpp", "hf,vllm:medusa", "llama.cpp", "vllm,vllm:ngram"])
def test_bad_peer_is_one_line_and_exit_2(capsys, value):
    code, out, err = run_cli(capsys, "bench", "--peer", value)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("specview bench: error:") and "--peer" in err


def test_without_llama_cpp_python_one_line_and_bench_goes_on(capsys, tmp_path, tiny_gguf, no_llama_cpp):
    doc, out, err = _bench(capsys, tmp_path, tiny_gguf, "--draft", "ngram", "--peer", "llamacpp,hf")
    said = [line for line in err.splitlines() if "llamacpp" in line or "llama-cpp" in line]
    assert said == [SKIP_NOT_INSTALLED] and "Traceback" not in err
    assert not any(name.startswith("llamacpp") for name in doc["methods"])
    assert {"hf_generate", "hf_prompt_lookup"} <= set(doc["methods"])  # the other peer still ran
    assert doc["peers_skipped"] == {"llamacpp": SKIP_NOT_INSTALLED.removeprefix("peer llamacpp skipped: ")}
    assert set(doc["peer_ratios"]) == {"autoregressive_over_hf_generate", "speculative_over_hf_prompt_lookup"}
    assert "skipped" not in out  # said once


def test_llama_cpp_alone_skipped_leaves_no_peer_ratios(capsys, tmp_path, tiny_gguf, no_llama_cpp):
    doc, out, err = _bench(capsys, tmp_path, tiny_gguf, "--draft", "ngram", "--peer", "llamacpp")
    assert err.count("peer llamacpp skipped") == 1
    assert list(doc["methods"]) == ["autoregressive", "speculative"] and doc["peer_ratios"] is None
    assert doc["config"]["peer"] == "llamacpp"


def test_a_target_that_is_not_gguf_skips_the_peer(capsys, tmp_path, gpt2_paths):
    doc, out, err = _bench(capsys, tmp_path, gpt2_paths[0], "--draft", gpt2_paths[1], "--prompt", "w1 w2 w3",
                           "--peer", "llamacpp")
    said = [line for line in err.splitlines() if "llamacpp" in line]
    assert said == [f"peer llamacpp skipped: the target {gpt2_paths[0]} is not a .gguf file (llama.cpp reads "
                    "GGUF files only)"]
    assert "llamacpp" in doc["peers_skipped"] and not any(m.startswith("llamacpp") for m in doc["methods"])


def test_gguf_path_of_a_spec(tiny_gguf):
    assert llamacpp.gguf_path(tiny_gguf) == tiny_gguf
    assert llamacpp.gguf_path(tiny_gguf + "@bfloat16") == tiny_gguf  # llama.cpp runs the file as it is
    assert llamacpp.unavailable("some-org/some-model").startswith("the target some-org/some-model is not a .gguf")


def test_a_file_llama_cpp_cannot_load_is_one_line(capsys, tmp_path, tiny_gguf, monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError(f"Failed to load model from file: {tiny_gguf}")

    monkeypatch.setattr(llamacpp, "unavailable", lambda spec: None)
    monkeypatch.setattr(llamacpp, "LlamaCppMethod", refuse)
    doc, out, err = _bench(capsys, tmp_path, tiny_gguf, "--draft", "ngram", "--peer", "llamacpp")
    said = [line for line in err.splitlines() if "llamacpp" in line]
    assert said == [f"peer llamacpp skipped: llama.cpp cannot load {tiny_gguf}: Failed to load model from file: "
                    f"{tiny_gguf}"]


# ---- with llama-cpp-python installed: a real run on the tiny GGUF (llama.cpp reads its float32 tensors)

def test_bench_with_llama_cpp_fills_the_document(capsys, tmp_path, tiny_gguf):
    pytest.importorskip("llama_cpp")
    doc, out, err = _bench(capsys, tmp_path, tiny_gguf, "--draft", "ngram", "-K", "3", "--peer", "llamacpp,hf",
                           "--num-runs", "2", "--threads", "1")
    assert "skipped" not in err and doc["peers_skipped"] == {}
    methods = doc["methods"]
    assert list(methods) == ["autoregressive", "speculative", "hf_generate", "hf_prompt_lookup",
                             "llamacpp_generate", "llamacpp_prompt_lookup"]
    for name in ("llamacpp_generate", "llamacpp_prompt_lookup"):
        m = methods[name]
        assert {"mean_s", "std_s", "tokens_per_s", "speedup", "runs", "peer"} <= set(m), name
        assert len(m["runs"]) == 2 and all(r["tokens"] == 8 and r["first_token_s"] > 0 for r in m["runs"])
        assert m["peer"]["gguf"] == tiny_gguf and m["peer"]["n_threads"] == 1
        assert m["peer"]["implementation"] == "llama-cpp-python" and m["peer"]["version"]
        # greedy: compared and reported, not required equal (llama.cpp's kernels are not ours)
        assert set(doc["same_tokens"][name]) == {"same", "first_difference"}
    assert methods["llamacpp_generate"]["peer"]["logits_all"] is False  # only prompt lookup needs every row
    assert {"max_ngram_size": 4, "num_pred_tokens": 3, "logits_all": True}.items() <= \
        methods["llamacpp_prompt_lookup"]["peer"].items()  # our ngram's longest n-gram, K
    tps = {name: m["tokens_per_s"] for name, m in methods.items()}
    ratios = doc["peer_ratios"]
    assert set(ratios) == {"autoregressive_over_hf_generate", "autoregressive_over_llamacpp_generate",
                           "speculative_over_llamacpp_generate", "speculative_over_hf_prompt_lookup",
                           "speculative_over_llamacpp_prompt_lookup"}
    assert math.isclose(ratios["autoregressive_over_llamacpp_generate"], tps["autoregressive"] / tps["llamacpp_generate"])
    assert math.isclose(ratios["speculative_over_llamacpp_prompt_lookup"],
                        tps["speculative"] / tps["llamacpp_prompt_lookup"])
    flat = " ".join(out.split())
    assert "llamacpp_generate" in flat and "llamacpp_prompt_lookup (ngram, K=3)" not in flat
    assert "llamacpp_prompt_lookup (K=3)" in flat and "llamacpp: llama-cpp-python" in flat
    assert "autoregressive / llamacpp_generate" in flat
    bench_file = tmp_path / "bench.json"
    code, out, err = run_cli(capsys, "report", str(bench_file))
    assert code == 0, err
    assert "llamacpp_prompt_lookup" in out


def test_without_an_ngram_drafter_llama_cpp_prompt_lookup_runs_at_the_main_k(capsys, tmp_path, tiny_gguf):
    pytest.importorskip("llama_cpp")
    doc, out, err = _bench(capsys, tmp_path, tiny_gguf, "--draft", tiny_gguf + "@bfloat16", "-K", "2",
                           "--sweep-k", "1,2", "--peer", "llamacpp")
    lookup = doc["methods"]["llamacpp_prompt_lookup"]
    assert len(lookup["runs"]) == 1 and lookup["peer"]["num_pred_tokens"] == 2
    assert lookup["peer"]["max_ngram_size"] == 4  # our ngram's default longest n-gram
    assert "llamacpp_prompt_lookup" in doc["same_tokens"] and "llamacpp_generate" in doc["same_tokens"]
    assert all("llamacpp_prompt_lookup" not in entry["methods"] for entry in doc["sweep"])  # not the same work
    assert set(doc["peer_ratios"]) == {"autoregressive_over_llamacpp_generate", "speculative_over_llamacpp_generate",
                                       "speculative_over_llamacpp_prompt_lookup"}


def test_planned_ks():
    class Peer:
        sweeps = False

    assert planned_ks("llamacpp_generate", object(), [1, 2, 4], 2) == [None]
    assert planned_ks("llamacpp_prompt_lookup", Peer(), [1, 2, 4], 2) == [2]
    assert planned_ks("hf_prompt_lookup", object(), [1, 2, 4], 2) == [1, 2, 4]
    assert planned_ks("speculative", object(), [1, 2, 4], 2) == [1, 2, 4]


@pytest.fixture
def session(tiny_gguf):
    pytest.importorskip("llama_cpp")
    settings = Settings(target=tiny_gguf, draft="ngram", prompt="the theme the theme", max_new_tokens=10,
                        temperature=0.0, ignore_eos=True, threads=1)
    return open_session(settings)


def test_the_peer_gets_our_prompt_ids_and_exactly_n_tokens(session):
    method = llamacpp.LlamaCppMethod(session, Stop())
    record = method.run()
    assert method.llm.n_ctx() >= len(session.prompt_ids) + 10
    assert record.tokens == 10 and record.k is None
    assert list(method.llm.input_ids[: len(session.prompt_ids)]) == session.prompt_ids  # no second tokenization
    assert method.run().generated_ids == record.generated_ids  # greedy, a full prefill each run
    assert method.info["n_threads"] == torch.get_num_threads() == 1


def test_the_peer_stops_at_our_eos_unless_ignore_eos(session):
    ids = llamacpp.LlamaCppMethod(session, Stop()).run().generated_ids
    at = next((i for i in range(1, len(ids)) if ids[i] not in ids[:i]), None)
    if at is None:
        pytest.skip("the greedy text is one repeated token")
    session.settings.ignore_eos = False
    session.target.model.generation_config.eos_token_id = [ids[at]]
    assert llamacpp.LlamaCppMethod(session, Stop()).run().generated_ids == ids[: at + 1]


def test_sampled_runs_follow_the_seed(session):
    session.settings.temperature = 1.0  # (a tiny random model: the sampled texts vary)
    runs = [[m.run().generated_ids for _ in range(3)]
            for m in (llamacpp.LlamaCppMethod(session, Stop()), llamacpp.LlamaCppMethod(session, Stop()))]
    assert runs[0] == runs[1]  # reproducible from --seed
    assert all(len(r) == 10 for r in runs[0]) and len({tuple(r) for r in runs[0]}) > 1  # a new seed per run


def test_a_stop_ends_the_run_at_the_next_token(session):
    stop = Stop()
    method = llamacpp.LlamaCppMethod(session, stop)
    stop.request("SIGINT")
    assert method.run().tokens == 1
