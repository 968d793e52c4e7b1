"""`specview bench` on tiny models: the JSON contract, the peers doing the same work as ours, greedy
token equality, interleaved rounds, the metrics' arithmetic and bad input. No timing is asserted."""

import copy
import json
import math

import pytest
import torch

from helpers import run_cli
from specview.bench.harness import run_rounds
from specview.bench.methods import HFMethod, generation_config, make_methods, no_eos
from specview.bench.metrics import predict, recommend, same_tokens, speculative_metrics, sweep_inputs
from specview.bench.options import BENCH_DEFAULTS, build_bench_parser, parse_sweep
from specview.core.events import RunSummary
from specview.core.metrics import expected_tokens_per_step
from specview.core.settings import Settings
from specview.core.stopping import Stop
from specview.session import open_session

METHODS = ["autoregressive", "speculative", "draft_autoregressive", "hf_generate", "hf_assisted"]




@pytest.fixture
def models(gpt2_paths):
    return ["--target", gpt2_paths[0], "--draft", gpt2_paths[1], "--prompt", "w1 w2 w3"]


@pytest.mark.parametrize("argv", [
    ["--peer", "sglang"], ["--peer", "vllm:medusa"], ["--peer", ""], ["--sweep-k", ""], ["--sweep-k", "1,,2"], ["--sweep-k", "a,b"],
    ["--sweep-k", "0,2"], ["--sweep-k", "2.5"], ["--num-runs", "0"], ["-R", "-1"], ["--num-runs", "x"],
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv):
    code, out, err = run_cli(capsys, "bench", *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("specview bench: error:")


def test_parse_sweep_sorts_and_dedups():
    assert parse_sweep("4, 1,2,2") == [1, 2, 4]


def test_bench_defaults_and_no_ignore_eos():
    parser = build_bench_parser()
    args = parser.parse_args([])
    assert (args.temperature, args.max_new_tokens, args.ignore_eos) == (0.6, 64, True)  # DESIGN defaults
    assert BENCH_DEFAULTS["ignore_eos"] and args.num_runs >= 1 and args.peer is None
    assert args.draft == "smollm2-135m@int4+head,smollm2-135m@int4"  # the default draft and the fastest, side by side
    assert parser.parse_args(["--no-ignore-eos"]).ignore_eos is False
    assert parser.parse_args(["--ignore-eos"]).ignore_eos is True
    args = parser.parse_args(["--target-model", "a", "--draft-model", "b", "--input-str", "x", "--N", "7",
                              "--K", "2", "--num-runs", "3", "--peer", "hf", "--sweep-k", "1,2"])
    assert (args.target, args.draft, args.prompt, args.max_new_tokens, args.k, args.num_runs, args.peer,
            args.sweep_k) == ("a", "b", "x", 7, 2, 3, "hf", [1, 2])


def test_bench_end_to_end_with_peers_and_sweep(capsys, models, tmp_path):
    out_json = tmp_path / "bench.json"
    code, out, err = run_cli(capsys, "bench", *models, "-N", "12", "-K", "3", "--num-runs", "2", "--peer", "hf", "--temperature", "0",
                             "--sweep-k", "1,3", "--json", str(out_json), "--profile-dir", str(tmp_path / "prof"))
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    assert doc["schema"] == "specview.bench/1"
    assert list(doc["methods"]) == METHODS
    for name, m in doc["methods"].items():
        assert {"mean_s", "std_s", "tokens_per_s", "runs"} <= set(m), name
        assert len(m["runs"]) == 2 and all(r["tokens"] == 12 for r in m["runs"]), name
        assert m["mean_s"] > 0 and m["std_s"] >= 0
    for key in ("acceptance_rate", "mean_emitted_per_step", "per_position_acceptance", "cost_ratio",
                "verify_cost_ratio", "ideal_speedup", "theoretical_speedup", "speedup", "efficiency"):
        assert key in doc, key
    assert len(doc["per_position_acceptance"]) == 3
    assert math.isclose(doc["efficiency"], doc["speedup"] / doc["theoretical_speedup"])
    k, c, v, e = doc["drafted_per_step"], doc["cost_ratio"], doc["verify_cost_ratio"], doc["mean_emitted_per_step"]
    assert 1 <= k <= doc["k"]
    assert math.isclose(doc["theoretical_speedup"], e / (k * c + v))
    assert math.isclose(doc["ideal_speedup"], e / (k * c + 1))
    # greedy: the target's distribution, five ways, token for token
    assert doc["same_tokens"] == {name: {"same": True, "first_difference": None}
                                  for name in ("hf_generate", "speculative", "hf_assisted")}
    assert [entry["k"] for entry in doc["sweep"]] == [1, 3]
    for entry in doc["sweep"]:
        assert set(entry["methods"]) == {"speculative", "hf_assisted"}
        assert entry["predicted"]["expected_tokens_per_step"] is not None
        assert entry["same_tokens"]["hf_assisted"]["same"]
    assert set(doc["recommended_k"]) == {"measured", "predicted"}
    ratios, tps = doc["peer_ratios"], {name: m["tokens_per_s"] for name, m in doc["methods"].items()}
    assert math.isclose(ratios["speculative_over_hf_assisted"], tps["speculative"] / tps["hf_assisted"])
    assert math.isclose(ratios["autoregressive_over_hf_generate"], tps["autoregressive"] / tps["hf_generate"])
    assert doc["recommended_k"]["measured"] in (1, 3)
    assert doc["config"]["ignore_eos"] is True and doc["config"]["num_runs"] == 2
    assert "methods" in out and "sweep over K" in out and "efficiency" in out
    roof = doc["roofline"]  # the timed speculative runs' forwards against their floors, and the one-token forward
    assert roof["bandwidth_gbs"] > 0 and roof["target"]["forwards"] > 0 and roof["draft"]["forwards"] > 0
    assert roof["target_one_token"]["forwards"] == 2 * 12  # every autoregressive step of the two rounds
    assert "roofline: forwards against the memory floor" in out and "why the speedup is what it is" in out
    from specview.analysis.diagnosis import Figures, diagnose

    said = diagnose(Figures.from_bench(doc))  # the bench's own figures, in words, after its tables
    assert said and all(" ".join(line.split()[:8]) in " ".join(out.split()) for line in said)
    assert "profile written: " in err and "bench file written: " in err
    files = list((tmp_path / "prof").glob("*.bench.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == doc
    code, out, err = run_cli(capsys, "report", str(files[0]))
    assert code == 0, err
    assert "hf_assisted" in out
    # docs/design/profiles.md: bench also writes a profile (+ Chrome trace) of its timed speculative runs, same stem
    stem = str(files[0]).removesuffix(".bench.json")
    profile = json.loads(open(stem + ".json").read())
    assert profile["schema"] == "specview.profile/1" and profile["summary"]["steps"] > 0
    assert profile["meta"]["t_ar_ms"] == doc["target_ms_per_token"]  # c and v as bench measured them
    assert profile["summary"]["cost_ratio"] == pytest.approx(doc["cost_ratio"])
    assert len({s["run"] for s in profile["steps"]}) == 2  # the two timed rounds at K=3, no warm-up
    trace = json.loads(open(stem + ".trace.json").read())
    assert any(e.get("ph") == "X" and e.get("name") == "verify" for e in trace["traceEvents"])


def test_sampling_bench_reports_no_token_equality(capsys, models, tmp_path):
    code, out, err = run_cli(capsys, "bench", *models, "-N", "8", "--num-runs", "1", "--temperature", "0.9",
                             "--top-k", "5", "--json", str(tmp_path / "b.json"), "--no-profile")
    assert code == 0, err
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["same_tokens"] is None and list(doc["methods"]) == METHODS[:3] and doc["peer_ratios"] is None
    assert "NaN" not in (tmp_path / "b.json").read_text()
    assert not (tmp_path / "profiles").exists()


def _session(paths, **kw):
    settings = Settings(target=paths[0], draft=paths[1], prompt="w1 w2 w3", **{"temperature": 0.0, **kw})
    return open_session(settings)


def _count_forwards(model):
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


def test_hf_assisted_drafts_exactly_k_per_step(gpt2_paths):
    # draft == target: every draft is accepted, so each target forward emits K + 1 tokens
    session = _session((gpt2_paths[0], gpt2_paths[0]), max_new_tokens=12, ignore_eos=True)
    session.draft.model = copy.deepcopy(session.target.model)  # one spec twice shares a model: count apart
    methods = make_methods(session, "hf", torch.Generator().manual_seed(0))
    session.draft.model.generation_config.num_assistant_tokens = 20  # a stale value must not leak in
    target_calls, draft_calls = _count_forwards(session.target.model), _count_forwards(session.draft.model)
    hf = methods["hf_assisted"].run(3)
    assert hf.tokens == 12 and len(target_calls) == 3  # 12 tokens / (3 + 1) per step
    assert session.draft.model.generation_config.num_assistant_tokens == 3
    target_calls.clear()
    ours = methods["speculative"].run(3)
    assert ours.summary.steps == 3 and ours.summary.acceptance_rate == 1.0
    assert len(target_calls) == 3 + 1  # + the prefill forward
    assert ours.generated_ids == hf.generated_ids
    assert len(draft_calls) > 0


def test_generation_config_sets_every_sampling_knob(gpt2_paths):
    session = _session(gpt2_paths, temperature=0.7, top_k=0, top_p=0.9, ignore_eos=True)
    gc = generation_config(session)
    assert gc.do_sample and gc.temperature == 0.7 and gc.top_k == 0 and gc.top_p == 0.9
    assert gc.eos_token_id is None and gc.repetition_penalty == 1.0 and gc.num_beams == 1
    session.settings.ignore_eos = False
    assert generation_config(session).eos_token_id == [2]
    model = session.target.model
    before = model.generation_config.eos_token_id
    with no_eos(model, None, True):
        assert model.generation_config.eos_token_id is None
    assert model.generation_config.eos_token_id == before


def test_peers_stop_at_eos_like_ours(gpt2_paths):
    """--no-ignore-eos: make a token of the greedy text (not its first) an EOS; every method stops there."""
    session = _session(gpt2_paths, max_new_tokens=12, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    free = make_methods(session, None, gen)["autoregressive"].run()
    ids = free.generated_ids
    at = next((i for i in range(1, len(ids)) if ids[i] not in ids[:i] and ids[i] != 2), None)
    if at is None:
        pytest.skip("the greedy text is one repeated token")
    stop = ids[at]
    session.settings.ignore_eos = False
    for lm in (session.target, session.draft):
        lm.model.generation_config.eos_token_id = [2, stop]
    methods = make_methods(session, "hf", gen)
    for name in ("autoregressive", "speculative", "hf_generate", "hf_assisted"):
        assert methods[name].run(3).generated_ids == ids[: at + 1], name


class Stub:
    def __init__(self, name, log, stop_at=None, stop=None):
        self.name, self.log, self.stop_at, self.stop = name, log, stop_at, stop

    def run(self, k=None):
        self.log.append((self.name, k))
        if self.stop_at is not None and len(self.log) >= self.stop_at:
            self.stop.request("SIGINT")  # what the signal handler does, mid-run
        return self.name


def test_rounds_warm_up_then_interleave():
    log = []
    methods = {n: Stub(n, log) for n in "ABC"}
    plan = [("A", None), ("B", 1), ("B", 2), ("C", None)]
    records = {}
    assert run_rounds(methods, plan, 2, records) is False
    assert log == plan * 3  # warm-up round, then two timed rounds in the same order
    assert {key: len(v) for key, v in records.items()} == {key: 2 for key in plan}


def test_ctrl_c_keeps_complete_rounds():
    """A stop during round 3's first run: that run is not a measurement, rounds 1 and 2 stay whole."""
    log, stop = [], Stop()
    methods = {n: Stub(n, log, stop_at=7, stop=stop) for n in "AB"}
    records = {}
    assert run_rounds(methods, [("A", None), ("B", None)], 5, records, stop=stop) is True
    assert len(log) == 7  # nothing ran after the stop
    assert {key: len(v) for key, v in records.items()} == {("A", None): 2, ("B", None): 2}


def _record(method, wall, steps, drafted, accepted, rejections, tokens, draft_ms, verify_ms):
    from specview.bench.methods import RunRecord

    s = RunSummary(steps=steps, drafted=drafted, accepted=accepted, rejections=rejections, emitted=tokens,
                   generated_ids=list(range(tokens)), per_position_drafted=[steps] * (drafted // max(steps, 1)),
                   per_position_accepted=[accepted // max(drafted // max(steps, 1), 1)] * (drafted // max(steps, 1)),
                   phases_ms={"draft": draft_ms, "verify": verify_ms, "sample": 1.0, "cache": 0.0, "other": 1.0})
    return RunRecord(method, None, wall, list(range(tokens)), s)


def test_metrics_follow_design_definitions():
    ar = [_record("autoregressive", 2.0, 40, 0, 0, 0, 40, 0.0, 400.0)]  # t_ar = 10 ms
    spec = [_record("speculative", 1.0, 10, 40, 30, 10, 40, 120.0, 150.0)]  # draft 3 ms/token, verify 15 ms
    m = speculative_metrics(4, spec, ar)
    assert m["target_ms_per_token"] == 10.0
    assert m["cost_ratio"] == pytest.approx(0.3) and m["verify_cost_ratio"] == pytest.approx(1.5)
    assert m["mean_emitted_per_step"] == 4.0 and m["alpha"] == 0.75 and m["acceptance_rate"] == 0.75
    assert m["ideal_speedup"] == pytest.approx(4.0 / (4 * 0.3 + 1))
    assert m["theoretical_speedup"] == pytest.approx(4.0 / (4 * 0.3 + 1.5))
    assert m["speedup"] == 2.0 and m["efficiency"] == pytest.approx(2.0 / m["theoretical_speedup"])
    assert m["expected_tokens_per_step"] == pytest.approx(expected_tokens_per_step(0.75, 4))
    entries = [dict(m, **sweep_inputs(spec)), dict(speculative_metrics(2, spec, ar), k=2, **sweep_inputs(spec))]
    predict(entries)
    p = entries[0]["predicted"]
    assert p["alpha"] == 0.75 and p["cost_ratio"] == pytest.approx(0.3)
    assert p["speedup"] == pytest.approx(expected_tokens_per_step(0.75, 4) / (4 * 0.3 + 1.5))
    assert recommend(entries)["predicted"] == 4


def test_no_rates_over_nothing():
    m = speculative_metrics(4, [_record("speculative", 1.0, 0, 0, 0, 0, 0, 0.0, 0.0)], [])
    assert m["cost_ratio"] is None and m["efficiency"] is None and m["alpha"] is None


def test_same_tokens_finds_the_first_difference():
    assert same_tokens([1, 2, 3], [1, 2, 3]) == {"same": True, "first_difference": None}
    assert same_tokens([1, 2, 3], [1, 5, 3]) == {"same": False, "first_difference": 1}
    assert same_tokens([1, 2, 3], [1, 2]) == {"same": False, "first_difference": 2}


def test_hf_method_keeps_prompt_out_of_the_output(gpt2_paths):
    session = _session(gpt2_paths, max_new_tokens=5, ignore_eos=True)
    record = HFMethod(session, assisted=False, stop=Stop()).run()
    assert record.tokens == 5 and record.to_json()["tokens"] == 5


def test_bench_times_a_list_of_policies_side_by_side(capsys, models, tmp_path):
    """--draft-policy a,b,c: each policy is a method of its own (the first keeps `speculative` and is the one
    swept, the others run at the main K, their maximum), every one greedy-equal to autoregressive, and the
    file and table put them side by side, against the best fixed K of the sweep."""
    out_json = tmp_path / "bench.json"
    code, out, err = run_cli(capsys, "bench", *models, "-N", "12", "-K", "3", "--num-runs", "1", "--temperature",
                             "0", "--sweep-k", "1,3", "--draft-policy", "fixed, p-min=0.5,goodput",
                             "--json", str(out_json), "--no-profile")
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    variants = ["speculative", "speculative[p-min=0.5]", "speculative[goodput]"]
    assert list(doc["methods"]) == ["autoregressive", *variants, "draft_autoregressive"]
    assert [doc["methods"][v]["policy"] for v in variants] == ["fixed", "p-min=0.5", "goodput"]
    assert all(doc["same_tokens"][v]["same"] for v in variants)  # lossless: the target's greedy tokens
    assert doc["config"]["draft_policy"] == "fixed,p-min=0.5,goodput"
    spec = doc["config"]["draft"]
    assert list(doc["policies"]) == ["fixed", "p-min=0.5", "goodput"]
    for by_spec in doc["policies"].values():
        d = by_spec[spec]
        assert d["k"] == 3 and len(d["drafted_length_histogram"]) == 4
        runs = doc["methods"][d["method"]]["runs"]
        assert sum(d["drafted_length_histogram"]) == sum(r["steps"] for r in runs)
        assert sum(d["stopped_by"].values()) == sum(r["steps"] for r in runs)
        assert set(d["stopped_by"]) <= {"budget", "p-min", "no-proposal"}
        # positions a policy did not draft are not counted: per-position figures only over drafted ones
        assert len(d["per_position_acceptance"]) <= 3
    assert doc["policies"]["fixed"][spec]["stopped_by"].get("p-min") is None
    assert doc["policies"]["fixed"][spec]["acceptance_rate"] == doc["acceptance_rate"]  # the top level: the first
    assert [e["k"] for e in doc["sweep"]] == [1, 3]  # only the first policy is swept
    assert "draft-length policies side by side" in out and "vs best fixed K" in out and "goodput" in out


@pytest.mark.parametrize("argv,needle", [
    (["bench", "--draft-policy", "fixed,,goodput"], "comma-separated list"),
    (["bench", "--draft-policy", "goodput,goodput"], "goodput is given twice"),
    (["bench", "--draft-policy", "fixed,p-min=2"], "p-min needs a cut-off"),
    (["run", "--draft-policy", "fixed,goodput"], "a comma-separated list is for bench and eval"),
])
def test_a_bad_policy_list_is_one_line(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_drafters_of_one_spec_share_its_model_and_every_model_is_prepared(gpt2_paths, monkeypatch):
    """A chain and a tree of the same draft (bench's side-by-side) run one model: a second copy was never given its
    forward (fast_path.prepare went by spec), so the second drafter ran transformers' forward at 2-3x the cost."""
    from specview.cpu import fast_path

    prepared = []
    real_prepare = fast_path.prepare
    monkeypatch.setattr(fast_path, "prepare", lambda lm, mode, say=None, **kw: prepared.append(lm.model)
                        or real_prepare(lm, mode, **kw))
    target, draft = gpt2_paths
    spec = f"{draft}@bfloat16"  # a derived model (a cast copy, like an @int4 copy): made anew by each load
    session = _session((target, f"{spec},{spec};tree:b=2,d=2"))
    models = [d.lm.model for d in session.drafters]
    assert len(models) == 2 and models[0] is models[1]
    assert {id(m) for m in prepared} == {id(session.target.model), id(models[0])} and len(prepared) == 2


@pytest.mark.parametrize("said", ["quiet", "busy"])
def test_bench_records_the_load_before_during_and_after_and_flags_a_busy_machine(capsys, models, tmp_path,
                                                                                  monkeypatch, said):
    """The load is said through SPECVIEW_LOAD (what the machine runs meanwhile must not decide a test): its record
    and the flag follow it, in the JSON and in the table and summary."""
    monkeypatch.setenv("SPECVIEW_LOAD", said)
    code, out, err = run_cli(capsys, "bench", *models, "-N", "4", "--num-runs", "1", "--temperature", "0",
                             "--json", str(tmp_path / "b.json"), "--no-profile")
    assert code == 0, err
    loads = json.loads((tmp_path / "b.json").read_text())["load"]
    assert set(loads) == {"before", "during", "after", "exceeded_free_cores"}
    assert loads["during"]["threads"] == torch.get_num_threads() and loads["during"]["cores"] >= 1
    assert loads["exceeded_free_cores"] is (said == "busy") and loads["during"]["quiet"] is (said == "quiet")
    text = " ".join(out.split())  # the table's lines wrap at the console's width
    assert ("EXCEEDED the free cores" in text) is (said == "busy")
    assert ("the machine was busy during these runs" in text) is (said == "busy")
    assert "load during the runs" in text
