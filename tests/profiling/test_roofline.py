"""The roofline: bytes each model's forward reads (counted by hand on tiny models), the bandwidth probe
and its cache, the per-forward figures of a profile's summary, the trace counter. No timing is asserted."""

import json
import os

import pytest
import torch

import tiny
from specview.core import host
from specview.cpu.matmul import packed_linear
from specview.drafters.layerskip import SkipModel
from specview.models.int4 import int4_copy
from specview.profiling import roofline
from specview.profiling.roofline import ForwardTally, floor_ms, model_bytes, roofline_summary


def _numel(t):
    return t.numel() * t.element_size()


def test_weights_count_every_parameter_once_and_an_embedding_as_one_row():
    model = tiny.make_model("llama", 16, 0, layers=2, width=32)  # untied head
    embed = model.get_input_embeddings().weight
    expected = sum(_numel(p) for p in model.parameters()) - _numel(embed) + embed.shape[1] * 4
    assert model_bytes(model)["weights"] == expected


def test_a_tied_head_is_counted_once_as_the_whole_matrix():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    # parameters() yields the tied matrix once: that is the count (the head reads all of it)
    assert model_bytes(model)["weights"] == sum(_numel(p) for p in model.parameters())


def test_gpt2_position_embeddings_are_lookups_too():
    model = tiny.make_model("gpt2", 16, 0, layers=2, width=32, n_positions=128)
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    expected = sum(_numel(p) for p in model.parameters()) - _numel(wte) - _numel(wpe) + 2 * 32 * 4
    assert model_bytes(model)["weights"] == expected


def test_int4_counts_packed_codes_scales_and_zeros():
    model = tiny.make_model("llama", 16, 0, layers=2, width=64)
    q = int4_copy(model)
    linears = [m for m in q.modules() if type(m).__name__ == "Int4Linear"]
    assert linears
    packed = sum(_numel(m.packed) + _numel(m.scales_and_zeros) for m in linears)
    codes = sum(m.in_features * m.out_features for m in linears) // 2  # 4 bits a weight
    assert sum(_numel(m.packed) for m in linears) == codes
    rest = sum(_numel(p) for p in q.parameters()) - _numel(q.get_input_embeddings().weight) + 64 * 2  # bf16 row
    assert model_bytes(q)["weights"] == packed + rest
    assert model_bytes(q)["weights"] < model_bytes(model)["weights"] / 3
    assert model_bytes(q)["kv_per_token"] == model_bytes(model)["kv_per_token"] // 2  # bfloat16 activations


def test_a_layer_skipping_view_counts_only_its_kept_layers():
    model = tiny.make_model("llama", 16, 0, layers=4, width=32)
    full = model_bytes(model)
    view = model_bytes(SkipModel(model, (1, 2)))
    layer = sum(_numel(p) for p in model.model.layers[0].parameters())
    assert full["weights"] - view["weights"] == 2 * layer
    assert view["kv_per_token"] * 2 == full["kv_per_token"]


def test_kv_bytes_per_token_from_the_config():
    model = tiny.make_model("llama", 16, 0, layers=2, width=32)  # 2 heads of 16, 1 kv head
    assert model_bytes(model)["kv_per_token"] == 2 * 2 * 1 * 16 * 4
    gpt2 = tiny.make_model("gpt2", 16, 0, layers=3, width=32)  # keys and values of the full width
    assert model_bytes(gpt2)["kv_per_token"] == 2 * 3 * 32 * 4


def test_the_probe_is_cached_per_machine_device_and_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_probe(device):
        calls.append(device)
        return {"gbs": 12.5, "bytes": roofline.probe_bytes(device), "method": "fake", "probe_s": 0.0,
                "measured_at": "now"}

    monkeypatch.setattr(roofline, "probe_bandwidth", fake_probe)
    assert roofline.measure_bandwidth("cpu")["gbs"] == 12.5
    assert roofline.measure_bandwidth("cpu")["gbs"] == 12.5
    assert len(calls) == 1  # the second came from the cache
    stored = json.loads((tmp_path / "bandwidth.json").read_text())
    [key] = stored
    assert "cpu" in key and f"threads={torch.get_num_threads()}" in key and stored[key]["method"] == "fake"
    stored[key].update(load_avg=1e6)  # probed on a busy machine: probed again once it is quiet, the best kept
    (tmp_path / "bandwidth.json").write_text(json.dumps(stored))
    monkeypatch.setattr(roofline, "_load", lambda: 0.0)
    assert roofline.measure_bandwidth("cpu")["gbs"] == 12.5 and len(calls) == 2
    assert roofline.measure_bandwidth("cpu")["gbs"] == 12.5 and len(calls) == 2  # quiet now: cached
    (tmp_path / "bandwidth.json").write_text("{not json")  # damaged: probed again, rewritten
    assert roofline.measure_bandwidth("cpu")["gbs"] == 12.5 and len(calls) == 3
    json.loads((tmp_path / "bandwidth.json").read_text())
    # A cache that grew past the probe (another machine under the same name, or an older probe's size): again
    monkeypatch.setattr(host, "last_level_cache_bytes", lambda: 2**30)
    assert roofline.measure_bandwidth("cpu")["gbs"] == 12.5 and len(calls) == 4


def test_probes_stream_past_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(host, "last_level_cache_bytes", lambda: 300 * 2**20)  # a Xeon VM's L3
    assert roofline.probe_bytes("cpu") == host.past_caches(roofline.PROBE_BYTES) == 600 * 2**20
    # A 576x1536 float32 matrix is 3.375 MiB: 178 of them reach 600 MiB (not the 64 MiB that L3 held)
    assert packed_linear.probe_matrices(torch.float32, (576, 1536)) == 178
    assert packed_linear.probe_matrices(torch.float32, (8, 8)) == packed_linear.PROBE_MATRICES  # a tiny model's: capped
    assert "streams 600 MiB" in packed_linear.probe_label()
    monkeypatch.setattr(host, "last_level_cache_bytes", lambda: 8 * 2**20)  # a small cache: the minimum holds
    assert roofline.probe_bytes("cpu") == roofline.PROBE_BYTES
    assert packed_linear.probe_bytes() == packed_linear.PROBE_BYTES


def test_the_last_level_cache_is_read_from_sysfs():
    size = host.last_level_cache_bytes()
    assert size >= 0 and (size == 0 or size >= 2**16)  # 0 where sysfs does not say; else at least 64 KiB
    if os.path.exists("/sys/devices/system/cpu/cpu0/cache/index0/size"):
        assert size >= 2**16  # sysfs says: read past its other entries ("uevent" beside the index folders)


def test_the_real_probe_gives_a_plausible_figure():
    figure = roofline.probe_bandwidth("cpu", nbytes=16 * 2**20, repeats=2)
    assert figure["gbs"] > 0 and "sum of a 16 MiB float32 tensor" in figure["method"]


def test_a_tally_averages_bytes_over_forwards_and_cache_lengths():
    tally = ForwardTally(weights=1_000_000, kv_per_token=100)
    tally.add(4, 10, 8.0)  # 4 forwards reading 10, 11, 12, 13 cached tokens
    fig = tally.figures(bandwidth_gbs=1.0)
    assert fig["forwards"] == 4 and fig["kv_bytes"] == pytest.approx(1150)
    assert fig["bytes"] == pytest.approx(1_001_150)
    assert fig["floor_ms"] == pytest.approx(1.00115)  # 1 GB/s reads 1 MB in 1 ms
    assert fig["ms"] == 2.0 and fig["share"] == pytest.approx(1.00115 / 2) and fig["above_ms"] == pytest.approx(0.99885)
    assert floor_ms(538e6, 40.0) == pytest.approx(13.45)


def _step(run, drafted, accepted, emitted, verify, draft, position=None, drafter=None):
    s = {"run": run, "drafted": list(range(drafted)), "accepted": accepted, "emitted": list(range(emitted)),
         "phases_ms": {"verify": verify, "draft": draft}}
    if position is not None:
        s["position"] = position
    if drafter:
        s["drafter"] = drafter
    return s


def test_the_summary_per_model_from_step_records():
    info = {"bandwidth_gbs": 2.0, "probe": "fake", "prompt_len": 10,
            "target": {"weights": 4_000_000, "kv_per_token": 1000},
            "drafters": {"d": {"weights": 1_000_000, "kv_per_token": 500}}}
    steps = [_step(0, 3, 3, 4, 5.0, 3.0), _step(0, 3, 1, 2, 5.0, 3.0), _step(1, 3, 0, 1, 7.0, 3.0)]
    out = roofline_summary(steps, info)
    # positions without a `position` field: 10, then 14 (4 emitted), then run 1 starts at 10 again
    assert out["target"]["forwards"] == 3 and out["target"]["kv_bytes"] == pytest.approx(1000 * 34 / 3)
    assert out["target"]["ms"] == pytest.approx(17 / 3)
    assert out["target"]["floor_ms"] == pytest.approx((4_000_000 + 1000 * 34 / 3) / 2e9 * 1000)
    kv_tokens = (3 * 10 + 3) + (3 * 14 + 3) + (3 * 10 + 3)
    assert out["draft"]["forwards"] == 9 and out["draft"]["kv_bytes"] == pytest.approx(500 * kv_tokens / 9)
    assert out["draft"]["ms"] == pytest.approx(1.0)
    with_positions = roofline_summary([_step(0, 0, 0, 1, 5.0, 0.0, position=100)], info)
    assert with_positions["target"]["kv_bytes"] == 100_000
    assert roofline_summary(steps, None) is None


def test_ngram_reads_no_weights_and_several_drafters_each_get_theirs():
    info = {"bandwidth_gbs": 2.0, "prompt_len": 4, "target": {"weights": 100, "kv_per_token": 0},
            "drafters": {"ngram": {"weights": 0, "kv_per_token": 0}, "m": {"weights": 50, "kv_per_token": 0}}}
    steps = [_step(0, 2, 2, 3, 1.0, 0.01, drafter="ngram"), _step(0, 2, 0, 1, 1.0, 2.0, drafter="m")]
    out = roofline_summary(steps, info)
    assert out["draft"]["forwards"] == 0 and out["draft"]["floor_ms"] is None and out["draft"]["bytes"] == 0
    assert out["drafters"]["m"]["forwards"] == 2 and out["drafters"]["m"]["ms"] == 1.0


def test_a_recorded_profile_has_the_roofline(loaded_pair, tmp_path):
    from specview.core.settings import Settings
    from specview.profiling.recorder import ProfileRecorder
    from specview.session import open_session

    target, draft = loaded_pair
    settings = Settings(target=target.spec, draft=draft.spec, max_new_tokens=8, k=3, temperature=0,
                        ignore_eos=True, prompt="w1 w2 w3")
    session = open_session(settings)
    recorder = ProfileRecorder(session, "speculative", str(tmp_path))
    decoder = session.decoder("speculative", timer=recorder.timer)
    recorder.attach(decoder)
    run = decoder.start(session.prompt_ids, 8)
    while not run.done:
        recorder.add_step(run.step())
    doc = json.loads(open(recorder.save([run.summary])).read())
    meta_roof, roof = doc["meta"]["roofline"], doc["summary"]["roofline"]
    assert meta_roof["target"] == model_bytes(session.target.model)
    assert roof["bandwidth_gbs"] > 0 and roof["target"]["forwards"] == doc["summary"]["steps"]
    assert roof["draft"]["forwards"] == doc["summary"]["drafted"]
    assert doc["meta"]["t_ar_ms"] > 0 and doc["summary"]["cost_ratio"] is not None
    assert [s["position"] for s in doc["steps"]][0] == 3
    trace = json.loads(open(recorder.trace_path).read())
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"].startswith("roofline")]
    assert counters and {"target floor ms", "target ms"} <= set(counters[0]["args"])


def test_the_products_time_follows_each_forward_rows():
    """A verify of d drafts multiplies d + 1 rows (a tree: its nodes + 1): its products' time is the one measured at
    that many rows, or between the nearest measured counts of two rows or more (one row runs another kernel);
    nothing past the most rows measured, and no mean where few forwards have a figure."""
    from specview.profiling.roofline import products_at, verify_rows

    products = {1: 2.0, 2: 5.0, 5: 8.0}
    assert [products_at(products, r) for r in (1, 2, 3, 4, 5)] == [2.0, 5.0, 6.0, 7.0, 8.0]
    assert products_at(products, 6) is None and products_at({1: 2.0, 5: 6.0}, 3) is None and products_at({}, 1) is None
    assert verify_rows(3) == 4 and verify_rows(2, {"tokens": [1, 2, 3, 4, 5, 6], "path": [0, 1]}) == 7
    info = {"bandwidth_gbs": 2.0, "prompt_len": 4, "target": {"weights": 100, "kv_per_token": 0,
                                                              "products_ms": {"1": 2.0, "2": 5.0, "5": 8.0}},
            "drafters": {"d": {"weights": 50, "kv_per_token": 0, "products_ms": {"1": 0.5}}}}
    steps = [_step(0, 4, 4, 5, 9.0, 2.0), _step(0, 2, 0, 1, 9.0, 1.0)]  # a verify of 5 rows, one of 3
    out = roofline_summary(steps, info)
    assert out["target"]["products_ms"] == pytest.approx((8.0 + 6.0) / 2)
    assert out["draft"]["products_ms"] == pytest.approx(0.5)
    tree = {**_step(0, 2, 2, 3, 9.0, 2.0), "tree": {"tokens": [1, 2, 3, 4], "parents": [-1, 0, -1, 2], "path": [0, 1]}}
    assert roofline_summary([tree], info)["target"]["products_ms"] == pytest.approx(8.0)  # 4 nodes: 5 rows
    untimed = roofline_summary(steps, {**info, "target": {"weights": 100, "kv_per_token": 0}})
    assert untimed["target"]["products_ms"] is None
    past = roofline_summary([_step(0, 4, 4, 5, 9.0, 2.0)] + [_step(0, 7, 0, 1, 9.0, 1.0)] * 2, info)
    assert past["target"]["products_ms"] is None  # two of three verifies past the rows measured


@pytest.mark.parametrize("products, kept", [(9.8, True), (10.0, False), (46.7, False)])
def test_products_slower_than_their_forward_are_left_out(products, kept):
    """The products are part of the forward: a figure well above the forward's own time was timed under load, and
    the diagnosis would blame the kernels on it (up to 1.1x: two moments' timings)."""
    info = {"bandwidth_gbs": 2.0, "prompt_len": 4, "target": {"weights": 100, "kv_per_token": 0,
                                                              "products_ms": {"5": products}}, "drafters": {}}
    out = roofline_summary([_step(0, 4, 4, 5, 9.0, 2.0)], info)  # a verify of 5 rows in 9.0 ms
    assert out["target"]["products_ms"] == (pytest.approx(products) if kept else None)


@pytest.mark.parametrize("junk", [{"x": 1.0}, {"0": 1.0}, {"-1": 1.0}, {"²": 1.0}, {"1": True}, {"1": -2.0},
                                  {"1": float("inf")}, {"1": "3"}, [1.0], "1", None])
def test_a_damaged_products_figure_is_left_out(junk):
    info = {"bandwidth_gbs": 2.0, "prompt_len": 4, "target": {"weights": 100, "kv_per_token": 0, "products_ms": junk},
            "drafters": {}}
    assert roofline_summary([_step(0, 0, 0, 1, 5.0, 0.0)], info)["target"]["products_ms"] is None
