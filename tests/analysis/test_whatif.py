"""What-if replay (specview/analysis/whatif.py) and cost curves (metrics.CostCurve, specview calibrate).

- the replay's expectations against a brute-force enumeration of the sampling procedure itself (every
  draft token of a small vocabulary, every accept and reject) on synthetic distributions;
- a greedy replay of a real tiny-model run against actual greedy runs at several K and policies: the same
  number of steps and the same accepted-length histogram, exactly;
- calibrate's fit on synthetic data, the per-machine cache, and both commands end to end on tiny models.
"""

from __future__ import annotations

import gzip
import json
import os
import random

import pytest
import torch

import tiny
from helpers import run_cli
from specview.analysis.whatif import ORACLE, StepCosts, Track, load_dists, replay, replay_track, tree_shape
from specview.analysis.whatif import Replay as ReplayFigures
from specview.core import host
from specview.core.errors import SpecviewError
from specview.core.metrics import CostCurve, CostModel, best_k, fit_cost_curve
from specview.core.settings import SamplingConfig
from specview.core.tree_shape import split_tree
from specview.drafters.ngram import NgramDrafter
from specview.drafters.tree import TreeDrafter
from specview.engine.decoder import Decoder
from specview.engine.drafter import ModelDrafter
from specview.models.loader import load_pair

# --- the replay's arithmetic against enumeration --------------------------------------------------------


def _law(rng: random.Random, vocab: int) -> list[float]:
    w = [rng.random() ** 3 for _ in range(vocab)]
    return [x / sum(w) for x in w]


def _brute_force(p: list[list[float]], q: list[list[float]], k: int, n: int):
    """Expected (steps, accepted, histogram) of the speculative sampling procedure run literally: from
    position t draft x ~ q_t, accept with probability min(1, p_t(x) / q_t(x)), next position; every token
    and verdict enumerated (positions keep the recorded prefix's laws, as the replay assumes)."""
    vocab = len(p[0])
    hist = [0.0] * (k + 1)

    def step(t: int, j: int, budget: int, prob: float):
        """-> (expected steps, expected accepted) from inside a step at draft j, given `prob` to be here."""
        if j == budget:  # every draft accepted: bonus, next step
            hist[j] += prob if budget else 0.0
            s, a = run(t + j + 1, prob)
            return s, a + prob * j
        steps = acc = 0.0
        for x in range(vocab):
            if q[t + j][x] == 0:
                continue
            take = min(1.0, p[t + j][x] / q[t + j][x])
            s, a = step(t, j + 1, budget, prob * q[t + j][x] * take)
            steps, acc = steps + s, acc + a
            hist[j] += prob * q[t + j][x] * (1 - take)
            s, a = run(t + j + 1, prob * q[t + j][x] * (1 - take))  # rejected: the residual token, next step
            steps, acc = steps + s, acc + a + prob * q[t + j][x] * (1 - take) * j
        return steps, acc

    def run(t: int, prob: float):
        if t >= n or prob == 0:
            return 0.0, 0.0
        s, a = step(t, 0, min(k, n - t - 1), prob)
        return s + prob, a

    steps, accepted = run(0, 1.0)
    return steps, accepted, hist


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sampling_replay_equals_enumeration_of_the_procedure(k):
    rng = random.Random(k)
    n, vocab = 6, 3
    p = [_law(rng, vocab) for _ in range(n)]
    q = [_law(rng, vocab) for _ in range(n)]
    run = {"tokens": list(range(n)), "drafters": {"d": {
        "kind": "model", "top_ids": [[0]] * n, "top_probs": [[max(row)] for row in q],
        "overlap": [sum(min(a, b) for a, b in zip(pr, qr)) for pr, qr in zip(p, q)]}}}
    got = replay({"greedy": False, "max_new_tokens": n, "runs": [run]}, "d", k)
    steps, accepted, hist = _brute_force(p, q, k, n)
    assert got.steps == pytest.approx(steps, rel=1e-12)
    assert got.accepted == pytest.approx(accepted, rel=1e-12)
    assert got.histogram == pytest.approx(hist[: len(got.histogram)], rel=1e-12, abs=1e-15)


def test_lookup_blocks_and_the_oracle():
    """A lookup drafter's blocks are its own per start; the oracle drafts exactly the matching run."""
    tokens = [5, 6, 7, 5, 6, 7, 8]
    blocks = [[6, 9], [7, 5], [], [6, 7, 1], [7, 8], [9], []]
    run = {"tokens": tokens, "drafters": {"ngram": {"kind": "lookup", "blocks": blocks, "block_p": [[0.5] * len(b) for b in blocks]}}}
    doc = {"greedy": True, "max_new_tokens": 7, "runs": [run]}
    fixed = replay(doc, "ngram", 3)
    # t=0: [6,9] vs 5 -> 0 accepted; t=1: [7,5] vs 6 -> 0; t=2: none; t=3: [6,7,1] vs 5? no: tokens[3] = 5 -> 0 ...
    assert fixed.steps == 7 and fixed.accepted == 0
    shifted = {"greedy": True, "max_new_tokens": 7, "runs": [{**run, "drafters": {"ngram": {
        "kind": "lookup", "blocks": [[5, 6, 9], [6, 7], [7, 5, 6], [5, 6, 7], [6], [7, 8], [8]],
        "block_p": [[1.0] * 3, [1.0] * 2, [1.0] * 3, [1.0] * 3, [1.0], [1.0] * 2, [1.0]]}}}]}
    got = replay(shifted, "ngram", 3)  # t=0: 5,6 match, 9 != 7 -> 2 accepted + 1; t=3: 5,6,7 -> 3 (cap 7-3-1=3)
    assert (got.steps, got.accepted, got.histogram) == (2, 5, [0, 0, 1, 1])
    oracle = replay(shifted, "ngram", 3, ORACLE)
    assert oracle.steps == 2 and oracle.drafted == 5 and oracle.acceptance_rate == 1.0


def test_costs_and_lost_time_add_up():
    curve = fit_cost_curve([1, 2, 3, 4, 5], [10.0, 14.0, 15.0, 16.0, 17.0], {"d": 2.0})
    costs = StepCosts(curve, 2.0, overhead_ms=1.0)
    n = 8
    run = {"tokens": list(range(n)), "drafters": {"d": {"kind": "model", "top_ids": [[0]] * n,
                                                         "top_probs": [[1.0]] * n, "argmax": [0, 1, 2, 9, 4, 5, 9, 7]}}}
    out = ReplayFigures("d", "fixed", 3)
    replay_track(Track(run, "d", greedy=True), 3, "fixed", costs, n, out)
    # steps: t=0 accepts 0,1,2 + bonus (4 tokens); t=4: 4,5 accepted, 9 rejected -> 3 tokens; t=7: last token alone
    assert (out.steps, out.accepted, out.drafted) == (3, 5, 6)
    assert out.ms == pytest.approx(out.forward_ms + out.overhead_ms)
    assert out.lost_drafts_ms == pytest.approx(1 * 2.0)
    assert out.lost_rows_ms == pytest.approx(curve.target_ms(4) - curve.target_ms(3))
    assert out.ar_ms == pytest.approx(n * (10.0 + 1.0))


# --- cost curves ---------------------------------------------------------------------------------------


def test_fit_recovers_a_synthetic_curve_and_predictions_use_it():
    rng = random.Random(0)
    rows = list(range(1, 18))
    ms = [20.0] + [30.0 + 2.5 * r + rng.uniform(-0.2, 0.2) for r in rows[1:]]
    curve = fit_cost_curve(rows, ms, {"draft": 8.0}, floor_ms=19.0)
    assert curve.intercept_ms == pytest.approx(30.0, abs=0.3) and curve.slope_ms == pytest.approx(2.5, abs=0.03)
    assert curve.t_ar_ms == 20.0 and curve.v(4) == pytest.approx((30 + 2.5 * 5) / 20, rel=0.01)
    assert CostCurve.from_json(json.loads(json.dumps(curve.to_json()))) == curve
    assert CostCurve.from_json({"rows": [1], "ms": "x"}) is None
    flat = CostModel(20.0, 8.0, None, 0.4, 1.2, None, 4)
    with_curve = CostModel(20.0, 8.0, None, 0.4, 1.2, None, 4, curve)
    assert flat.predicted(0.8, 8)[1] > with_curve.predicted(0.8, 8)[1]  # one v flatters long blocks
    assert (flat.v_at(8), with_curve.v_at(8)) == (1.2, curve.v(8))
    steep = fit_cost_curve(rows, [20.0] + [20.0 + 8.0 * r for r in rows[1:]])  # each row costs 40% of one
    assert best_k(CostModel(20.0, 8.0, None, 0.4, 1.2, None, 4, steep), 0.95, rows)[0] < best_k(flat, 0.95, rows)[0]


def test_goodput_prices_on_the_curve():
    from types import SimpleNamespace

    from specview.core.policies import make_policy

    cheap = fit_cost_curve([1, 2, 3, 9], [10.0, 10.5, 11.0, 14.0], {"d": 0.5})
    costly = fit_cost_curve([1, 2, 3, 9], [10.0, 20.0, 30.0, 90.0], {"d": 9.0})
    seen = SimpleNamespace(drafted=[1, 2], accepted=1, rejected_at=1, phases_ms={})  # acceptance, no timings

    def after_one_step(*args):
        policy = make_policy("goodput", None, *args)
        assert policy.budget(6) == 6  # no acceptance seen yet: drafts K to measure
        policy.observe(seen)
        return policy.budget(6)

    assert after_one_step(cheap, "d") >= 1
    assert after_one_step(costly, "d") == 0
    assert after_one_step() == 6 and after_one_step(costly, "other") == 6  # no costs for this drafter: K


def test_the_curve_is_kept_per_machine():
    key = host.cost_key("t", 1, torch.__version__, "eager")
    curve = fit_cost_curve([1, 2, 3], [1.0, 2.0, 3.0])
    host.store_cached(host.COSTS_FILE, {key: {"curve": curve.to_json()}})
    meta = {"cpu": host.cpu_summary(), "threads": 1, "target": "t", "versions": {"torch": torch.__version__},
            "forwards": {"t": {"mode": "eager"}}}
    assert host.cached_curve(host.profile_cost_key(meta)) == curve
    assert host.profile_cost_key({**meta, "cpu": "another CPU (avx2)"}) is None
    bench_meta = {k: v for k, v in meta.items() if k != "target"} | {"config": {"target": "t"}}  # bench: in config
    assert host.cached_curve(host.profile_cost_key(bench_meta)) == curve
    assert host.cached_curve(host.profile_cost_key({**meta, "threads": 2})) is None


# --- end to end on tiny models -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agreeing_pair(tiny_dir):
    """A draft that is the target plus noise (vocab 16): greedy steps accept some drafts and reject others."""
    return tiny.save_noisy_pair(tiny_dir, "whatif", "gpt2", 16, 21, scale=6.0, noise=0.25, noise_seed=4)


@pytest.fixture(scope="module")
def recorded(agreeing_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("whatif-profiles")
    t, d = agreeing_pair
    from specview.cli.main import main

    code = main(["run", "--target", t, "--draft", f"{d},ngram", "--prompt", "w1 w2 w3 w1 w2", "--temperature", "0",
                 "-N", "40", "-K", "3", "--ignore-eos", "--record-dists", "--profile-dir", str(out), "-q"])
    assert code == 0
    profile = next(p for p in out.iterdir() if p.name.endswith(".json") and p.name.count(".") == 1)
    return str(profile)


def _actual(pair, drafter_spec, k, policy, prompt_ids):
    target, draft = pair
    drafter = ModelDrafter(draft) if drafter_spec == "model" else NgramDrafter("ngram")
    dec = Decoder(target, drafter, SamplingConfig(temperature=0.0), k=k, ignore_eos=True, policy=policy)
    steps = list(dec.generate(prompt_ids, 40))
    hist = [0] * (k + 1)
    for s in steps:
        if s.drafted:
            hist[s.accepted] += 1
    cuts = sum(s.stopped_by == "p-min" for s in steps)
    return [t for s in steps for t in s.emitted], len(steps), hist, cuts


def test_greedy_replay_predicts_every_actual_run(recorded, agreeing_pair):
    profile = json.load(open(recorded))
    dists_path = recorded[: -len(".json")] + ".dists.json.gz"
    assert profile["meta"]["files"]["dists"] == os.path.basename(dists_path)
    assert profile["meta"]["dists"]["tokens"] == 40 and profile["meta"]["dists"]["bytes_per_1000_tokens"] > 0
    dists = load_dists(dists_path)
    run = dists["runs"][0]
    assert len(run["tokens"]) == 40 and set(run["drafters"]) == {agreeing_pair[1], "ngram"}
    assert run["target"]["argmax"] == run["tokens"]  # greedy: the text is the target's argmax
    pair = load_pair(*agreeing_pair, torch.device("cpu"))
    seen_rejection = False
    for spec, kind in ((agreeing_pair[1], "model"), ("ngram", "ngram")):
        # p-min 0.15 both drafts and cuts on this pair (0.5 drafted nothing in 40 steps: it checked nothing)
        for k, policy in ((1, "fixed"), (2, "fixed"), (3, "fixed"), (5, "fixed"), (4, "heuristic"), (4, "p-min=0.15")):
            if kind == "ngram" and policy.startswith("p-min"):
                continue
            tokens, steps, hist, cuts = _actual(pair, kind, k, policy, run["prompt_ids"])
            if policy.startswith("p-min"):
                assert sum(hist) > 5 and cuts > 5 and 0 < hist[0], (hist, cuts)  # drafted, cut, and rejected
            assert tokens == run["tokens"]
            got = replay(dists, spec, k, policy)
            assert (got.steps, got.tokens) == (steps, 40), (spec, k, policy)
            assert got.histogram == hist[: len(got.histogram)] and sum(hist[len(got.histogram):]) == 0, (spec, k, policy)
            seen_rejection |= 0 < got.accepted < got.drafted
    assert seen_rejection


@pytest.mark.parametrize("options", ["tree:b=2,d=3,w=1", "tree:b=4,d=2,w=1", "tree:b=3,w=1,min=0.05"])
def test_greedy_tree_replay_predicts_the_actual_tree_run(recorded, agreeing_pair, options):
    """A w=1 tree replayed over the chain's record (siblings: the draft's next likeliest tokens where the chain's
    node was rejected) gives the steps, drafts, acceptances and nodes of the engine's own tree run."""
    dists = load_dists(recorded[: -len(".json")] + ".dists.json.gz")
    run = dists["runs"][0]
    target, draft = load_pair(*agreeing_pair, torch.device("cpu"))
    spec = f"{agreeing_pair[1]};{options}"
    drafter = TreeDrafter(ModelDrafter(draft), split_tree(spec)[1], spec)
    steps = list(Decoder(target, drafter, SamplingConfig(temperature=0.0), k=3, ignore_eos=True)
                 .generate(run["prompt_ids"], 40))
    assert [t for s in steps for t in s.emitted] == run["tokens"]
    got = replay(dists, spec, 3)
    assert (got.steps, got.tokens) == (len(steps), 40), options
    assert (got.drafted, got.accepted) == (sum(len(s.drafted) for s in steps), sum(s.accepted for s in steps))
    assert got.rejections == sum(s.rejected_at is not None for s in steps)
    if "min" not in options:  # min=: the siblings counted below a rejection come from the text's distributions
        assert got.nodes == sum(len(s.tree["tokens"]) if s.tree else len(s.drafted) for s in steps)
    hist = [0] * (got.k + 2)
    for s in steps:
        if s.drafted:
            hist[s.accepted] += 1
    assert got.histogram == hist[: len(got.histogram)]
    saved = [s for s in steps if s.tree and s.tree["path"] and s.tree["path"][-1] not in
             [j for j, parent in enumerate(s.tree["parents"]) if s.tree["parents"].index(parent) == j]]
    if options == "tree:b=2,d=3,w=1":
        assert saved, "some step must accept a sibling, or the replay's siblings are untested"
        chain = replay(dists, agreeing_pair[1], 3)
        assert got.tokens_per_step > chain.tokens_per_step


def test_tree_replay_refuses_what_the_record_cannot_decide(recorded, agreeing_pair):
    dists = load_dists(recorded[: -len(".json")] + ".dists.json.gz")
    d = agreeing_pair[1]
    assert tree_shape(dists, d) is None and tree_shape(dists, f"{d};tree:b=2,w=1").width() == 1
    for spec, why in ((f"{d};tree:b=2,d=3", "w=1"), (f"{d};tree:nodes=6", "w=1"), ("ngram;tree:b=2", "model drafter"),
                      ("other;tree:w=1", "not recorded"), (f"{d};tree:nodes=4,b=2,w=1", "nodes=")):
        with pytest.raises(SpecviewError, match=why):
            tree_shape(dists, spec)
    with pytest.raises(SpecviewError, match="greedy"):
        tree_shape({**dists, "greedy": False}, f"{d};tree:b=2,w=1")
    # A tree drafter that ran and was recorded under its own spec: replayed as the chain it recorded, not refused
    # (whatif's defaults and the TUI's w key replay every recorded drafter).
    ran = {**dists, "runs": [{**r, "drafters": {f"{d};tree:b=2,d=3": r["drafters"][d]}} for r in dists["runs"]]}
    assert tree_shape(ran, f"{d};tree:b=2,d=3", strict=False) is None
    assert replay(ran, f"{d};tree:b=2,d=3", 3).tokens_per_step == replay(dists, d, 3).tokens_per_step


def test_whatif_and_calibrate_commands(recorded, agreeing_pair, tmp_path, capsys):
    out = tmp_path / "w.json"
    code, stdout, _ = run_cli(capsys, "whatif", recorded, "-K", "1,3", "--draft-policy", "fixed,heuristic",
                              "--json", str(out), "--no-plot")
    assert code == 0 and "tokens/step" in stdout and "oracle" in stdout
    doc = json.loads(out.read_text())
    entry = doc["drafters"][agreeing_pair[1]]
    assert [(r["policy"], r["k"]) for r in entry["replays"]] == [("fixed", 1), ("fixed", 3), ("heuristic", 1), ("heuristic", 3)]
    assert entry["replays"][0]["speedup"] is not None  # the run's own drafter: costs from the profile
    assert doc["recorded"]["k"] == 3
    own = next(r for r in entry["replays"] if r["k"] == 3 and r["policy"] == "fixed")
    assert own["tokens_per_step"] == pytest.approx(doc["recorded"]["tokens_per_step"])
    code, _, err = run_cli(capsys, "whatif", recorded, "-K", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1
    tree = f"{agreeing_pair[1]};tree:b=2,d=3,w=1"
    code, stdout, _ = run_cli(capsys, "whatif", recorded, "--drafter", f"{agreeing_pair[1]},{tree}",
                              "--json", str(out), "--no-plot")
    assert code == 0 and "tree:b=2,d=3,w=1" in stdout
    doc = json.loads(out.read_text())
    assert [r["k"] for r in doc["drafters"][tree]["replays"]] == [3]  # d=3: the depth, whatever K
    assert doc["drafters"][tree]["replays"][0]["nodes_per_step"] > doc["drafters"][agreeing_pair[1]]["replays"][0]["nodes_per_step"]
    code, _, err = run_cli(capsys, "whatif", recorded, "--drafter", f"{agreeing_pair[1]};tree:b=2,d=3", "--no-plot")
    assert code == 2 and "w=1" in err and len(err.strip().splitlines()) == 1
    bare = tmp_path / "bare.json"
    bare.write_text(open(recorded).read())
    code, _, err = run_cli(capsys, "whatif", str(bare))
    assert code == 2 and "--record-dists" in err
    t, d = agreeing_pair
    code, stdout, err = run_cli(capsys, "calibrate", "--target", t, "--draft", f"{d},ngram", "--repeats", "1",
                                "--max-rows", "4", "--profile-dir", str(tmp_path), "--no-plot")
    assert code == 0 and "per drafted token" in stdout
    written = json.loads(next(p for p in tmp_path.glob("calibrate-*.json")).read_text())
    assert written["curve"]["rows"] == [1, 2, 3, 4] and set(written["curve"]["draft_ms"]) == {d, "ngram"}
    assert list(tmp_path.glob("calibrate-*.png")) and list(tmp_path.glob("calibrate-*.svg"))
    assert host.cached_curve(written["key"]) is not None
    with gzip.open(recorded[: -len(".json")] + ".dists.json.gz", "rt") as f:
        assert json.load(f)["schema"] == "specview.dists/1"


@pytest.mark.asyncio
async def test_the_tui_w_key_shows_this_run_replayed(agreeing_pair, tmp_path):
    from specview.backend.in_process import EngineBackend
    from specview.core.settings import Settings
    from specview.tui.app import SpecviewApp
    from specview.tui.widgets.whatif_screen import WhatIfScreen, whatif_view

    settings = Settings(target=agreeing_pair[0], draft=f"{agreeing_pair[1]},ngram", prompt="w1 w2 w3", max_new_tokens=20,
                        k=3, temperature=0.0, ignore_eos=True, profile_dir=str(tmp_path))
    app = SpecviewApp(EngineBackend(settings))
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(100):
            await app.workers.wait_for_complete()
            await pilot.pause()
            if app.loaded:
                break
        await pilot.press("w")  # before a step: a notice, no screen
        await pilot.pause()
        assert not isinstance(app.screen, WhatIfScreen)
        for _ in range(3):
            await pilot.press("space")
            await app.workers.wait_for_complete()
            await pilot.pause()
        await pilot.press("w")
        for _ in range(50):
            await app.workers.wait_for_complete()
            await pilot.pause()
            if isinstance(app.screen, WhatIfScreen):
                break
        assert isinstance(app.screen, WhatIfScreen)
        figures = app.screen.figures
        assert set(figures["drafters"]) == {agreeing_pair[1], "ngram"}
        own = next(r for r in figures["drafters"][agreeing_pair[1]]["replays"] if r["k"] == 3 and r["policy"] == "fixed")
        steps = app.backend.run.summary.steps
        assert own["steps"] == steps  # greedy: the replay of the run's own setting is the run
        from rich.console import Console

        console = Console(width=120, record=True)
        console.print(whatif_view(figures))
        text = console.export_text()
        assert "tok/step" in text and "oracle" in text
        assert own["speedup"] is not None  # the run's own drafter: costs from the run's own times
        await pilot.press("escape")
        assert not isinstance(app.screen, WhatIfScreen)
