"""Token trees (docs/design/trees.md): one forward over the flattened tree gives each node the logits of its own
path (transformers' 4-D mask on GPT-2 and Llama, and the engine's own forward); the cache keeps the accepted
path only; greedy tree decoding equals greedy autoregressive decoding; sampled trees keep the target's exact
law (test_lossless.py's enumeration test), and trying siblings against the unmodified p is caught."""

import json

import pytest
import torch
from laws import CASES, N_TOKENS, exact_joint, on_engine_forward, tv, tv_threshold

from specview.core.draft_spec import parse_draft, parse_drafts
from specview.core.errors import SpecviewError
from specview.core.metrics import Counts
from specview.core.policies import GoodputFigures
from specview.core.settings import SamplingConfig
from specview.core.tree_shape import split_tree
from specview.cpu import forward_choice
from specview.cpu.fast_path import CpuForward
from specview.cpu.forward import aot_compile, llama
from specview.drafters.ngram import NgramDrafter
from specview.drafters.tree import TreeDrafter
from specview.engine import accept_rule
from specview.engine.decoder import Decoder, token_tree
from specview.engine.drafter import ModelDrafter
from specview.engine.kv_cache import keep_rows, new_cache
from specview.models.stock_forward import StockForward

PROMPT = [1, 5, 9, 11]
SMALL = [1, 5, 3, 6]  # a prompt for the vocabulary-8 pairs
BRANCHING = [5, 6, 7, 5, 6, 3, 5, 6]  # "5 6" was followed by 7 and by 3: an n-gram tree of two branches
#        0   1   2   3   4   5   6      a tree of 7 nodes: two children of the root, branches of both
PARENTS = [-1, -1, 0, 0, 1, 2, 4]
NODES = [3, 7, 4, 12, 6, 3, 9]


def tree_drafter(draft, options: str):
    spec = f"{draft.spec if hasattr(draft, 'spec') else 'ngram'};{options}"
    base = NgramDrafter("ngram:max=2,min=1") if draft is None else ModelDrafter(draft)
    return TreeDrafter(base, split_tree(spec)[1], spec)


def assert_step_labels(step) -> None:
    """A tree step's labels: `rejected_at` indexes `drafted` (the spine: the accepted path, then the first child of
    each node below it) or is null; the extra token is `resampled` exactly when a child of the last accepted node
    was tried and rejected, else it is the `bonus` (a sibling rejected before a later one was accepted down to a
    leaf leaves a bonus). What Counts, alpha and the policies read of the step stays within `drafted`."""
    n, rejected = len(step.drafted), step.rejected_at is not None
    assert step.rejected_at is None or 0 <= step.rejected_at < n, (step.rejected_at, step.drafted)
    assert step.accepted + rejected <= n and step.emitted[: step.accepted] == step.drafted[: step.accepted]
    if rejected:
        assert step.rejected_at == step.accepted and step.bonus is None and step.residual_top
        assert step.resampled == step.emitted[-1]
    else:
        assert step.resampled is None and step.residual_top is None
        assert step.bonus == step.emitted[-1] or step.stop_reason == "eos"
    if step.tree is not None:
        parents, path = step.tree["parents"], step.tree["path"]
        last = path[-1] if path else -1
        assert rejected == any(parents[j] == last for j in step.tree["rejected"]), step.tree
        assert step.drafted == [step.tree["tokens"][j] for j in token_tree.spine(parents, path)]
    figures = GoodputFigures()
    figures.observe(step)
    assert len(figures.tried) <= n and sum(figures.passed) == step.accepted  # examined = rejected_at + 1 <= n


def assert_counts_agree(steps) -> None:
    """Counts (alpha, acceptance, per position) over the steps read the same labels."""
    counts = Counts()
    for step in steps:
        counts.add(step)
    assert counts.rejections == sum(s.rejected_at is not None for s in steps)
    assert counts.accepted + counts.rejections <= counts.drafted
    assert all(a <= r <= d for a, r, d in zip(counts.per_position_accepted, counts.per_position_reached,
                                               counts.per_position_drafted))
    if counts.accepted + counts.rejections:
        assert 0.0 <= counts.alpha <= 1.0


def ancestry(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node`."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@pytest.mark.parametrize("forward", ["transformers", "the engine's own forward",
                                     pytest.param("compiled", marks=pytest.mark.skipif(
                                         aot_compile.unavailable_reason() is not None, reason="cannot compile here"))])
def test_one_forward_over_the_tree_gives_each_path_its_logits(loaded_pair, forward, monkeypatch):
    """`compiled`: the whole-layer function of several rows built ahead of time, its mask [rows, end] symbolic in
    both sizes, the one the default backend runs for a tree's verify."""
    target, _ = loaded_pair
    if forward != "transformers":  # the Llama family's forward, or the GPT-2 forward's: the same loop, positions and mask
        family, reason = forward_choice._family(target.model)
        assert reason is None, reason
        monkeypatch.setenv("SPECVIEW_AOT", "1")
        llama.install(target.model, compiled=forward == "compiled", family=family)
        target.forward = CpuForward(target.model)
    try:
        dec = Decoder(target, None, SamplingConfig(temperature=0))
        cache = new_cache(target)
        dec.forward(target, cache, PROMPT[:-2])
        layout = token_tree.layout(PARENTS, len(PROMPT) - 2, 2, dec.device)  # two fed tokens, the root last
        got = dec.forward(target, cache, PROMPT[-2:] + NODES, tree=layout)
        for j in range(len(NODES)):
            plain = dec.forward(target, new_cache(target), PROMPT + [NODES[i] for i in ancestry(PARENTS, j)])
            torch.testing.assert_close(got[2 + j], plain[-1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[1], plain[len(PROMPT) - 1], atol=1e-4, rtol=1e-4)
        # Keep node 6's path (1, 4, 6): the cache must then be that of the text followed by the path.
        keep_rows(cache, len(PROMPT), ancestry(PARENTS, 6))
        assert cache.get_seq_length() == len(PROMPT) + 3
        after = dec.forward(target, cache, [8])
        plain = dec.forward(target, new_cache(target), PROMPT + [NODES[i] for i in ancestry(PARENTS, 6)] + [8])
        torch.testing.assert_close(after[-1], plain[-1], atol=1e-4, rtol=1e-4)
    finally:
        llama.uninstall(target.model)
        target.forward = StockForward()


SHAPES = ["tree:b=2,d=3", "tree:nodes=6,b=3,d=4", "tree:b=3,d=1", "tree:b=3,d=3,w=1,min=0.02"]


@pytest.mark.parametrize("options", SHAPES + ["ngram"])
def test_greedy_tree_equals_greedy_autoregressive(loaded_pair, options):
    target, draft = loaded_pair
    greedy = SamplingConfig(temperature=0)
    prompt = BRANCHING if options == "ngram" else PROMPT
    want = [t for s in Decoder(target, None, greedy, ignore_eos=True).generate(prompt, 30) for t in s.emitted]
    drafter = tree_drafter(None, "tree:b=3") if options == "ngram" else tree_drafter(draft, options)
    steps = list(Decoder(target, drafter, greedy, k=4, ignore_eos=True).generate(prompt, 30))
    assert [t for s in steps for t in s.emitted] == want
    for step in steps:
        assert_step_labels(step)
    assert_counts_agree(steps)
    records = [s.to_json()["tree"] for s in steps if s.tree is not None]
    assert records, "some step must draft a tree wider than a chain"
    for record in records:
        token_tree.check(record["parents"])
        assert record["path"] == [] or record["parents"][record["path"][0]] == -1
        assert all(record["parents"][b] == a for a, b in zip(record["path"], record["path"][1:]))
        assert record["r"] is None


@pytest.mark.parametrize("options", ["tree:b=2,d=3", "tree:b=2,d=3,w=1", "tree:nodes=5,b=3,d=3,min=0.02"])
def test_every_node_carries_the_draft_law_of_its_own_path(loaded_pair, options):
    """The draft's cache across steps (levels fed with a mask, or as one sequence while each level is one node;
    the accepted path's rows kept, the rest dropped): each node's q(x) is what a fresh draft gives after the text
    and the node's ancestors. A stale or misplaced row would change some q and nothing else (the verify is
    lossless whatever the draft proposes), so only this test sees it."""
    target, draft = loaded_pair
    greedy = SamplingConfig(temperature=0)
    dec = Decoder(target, tree_drafter(draft, options), greedy, k=3, ignore_eos=True)
    text, checked = list(PROMPT), 0
    for step in dec.generate(PROMPT, 24):
        record = step.to_json().get("tree")
        for j, token in enumerate(record["tokens"] if record else []):
            fed = text + [record["tokens"][i] for i in ancestry(record["parents"], j)[:-1]]
            q = torch.softmax(dec.forward(draft, new_cache(draft), fed)[-1].float(), dim=-1)
            assert abs(float(q[token]) - record["q"][j]) < 1e-4, (options, step.step, j)
            checked += 1
        text += step.emitted
    assert checked > 20


def test_preorder_puts_each_first_child_after_its_parent():
    assert token_tree.preorder(PARENTS) == [0, 2, 5, 3, 1, 4, 6]
    renumbered = token_tree.renumber(PARENTS, token_tree.preorder(PARENTS))
    token_tree.check(renumbered)
    assert renumbered == [-1, 0, 1, 0, -1, 4, 5]
    assert token_tree.spine(renumbered, [0]) == [0, 1, 2]  # the first-child path: consecutive rows


def test_own_forward_tree_verify_is_greedy_equal(small_llama_pair):
    target, draft = small_llama_pair
    greedy = SamplingConfig(temperature=0)
    want = [t for s in Decoder(target, None, greedy, ignore_eos=True).generate(SMALL, 24) for t in s.emitted]
    for lm in (target, draft):
        llama.install(lm.model, compiled=False)
        lm.forward = CpuForward(lm.model)
    try:
        steps = list(Decoder(target, tree_drafter(draft, "tree:b=2,d=3"), greedy, ignore_eos=True).generate(SMALL, 24))
    finally:
        for lm in (target, draft):
            llama.uninstall(lm.model)
            lm.forward = StockForward()
    assert [t for s in steps for t in s.emitted] == want
    assert any(len(s.tree["path"]) > 1 and s.tree["path"] != list(range(len(s.tree["path"])))
               for s in steps if s.tree), "an accepted path off the first branch must occur (rows gathered)"


def test_a_tree_of_width_one_is_the_chain(small_vocab_pair):
    """b=1 drafts exactly the chain: the same draws from the one generator, the same decisions."""
    target, draft = small_vocab_pair
    cfg = CASES["temperature 0.7, top-k 3"]
    chain = [s.to_json() for s in Decoder(target, draft, cfg, k=3, seed=4, ignore_eos=True).generate(SMALL, 20)]
    tree = [s.to_json() for s in Decoder(target, tree_drafter(draft, "tree:b=1,d=3"), cfg, k=3, seed=4,
                                          ignore_eos=True).generate(SMALL, 20)]
    fields = ("drafted", "q", "p", "r", "accepted", "rejected_at", "resampled", "bonus", "emitted")
    assert [[s[f] for f in fields] for s in tree] == [[s[f] for f in fields] for s in chain]
    assert all("tree" not in s for s in tree)


LAW_SAMPLES = 1200  # 40% of test_lossless's: these run a tree drafter's extra forwards (tv_threshold is for this count)


@pytest.fixture(scope="module")
def fast_pair(small_llama_pair):
    """The vocabulary-8 Llama pair on the engine's own eager forward: the law tests' thousands of runs cost a
    third of transformers' forward (what they test is the decision, the forward is tested above)."""
    with on_engine_forward(*small_llama_pair):
        yield small_llama_pair


def tree_counts(target, drafter, cfg, prompt, samples=LAW_SAMPLES):
    """Counts of the first three tokens, and how often a second or later sibling was tried."""
    decoder = Decoder(target, drafter, cfg, k=2, seed=11, ignore_eos=True)
    counts, later_siblings = torch.zeros(8**N_TOKENS, dtype=torch.float64), 0
    for _ in range(samples):
        run = decoder.start(prompt, N_TOKENS)
        while not run.done:
            step = run.step()
            assert_step_labels(step)
            if step.tree:
                first = {}
                for j, parent in enumerate(step.tree["parents"]):
                    first.setdefault(parent, j)
                later_siblings += sum(first[step.tree["parents"][j]] != j
                                      for j in step.tree["rejected"] + step.tree["path"])
        a, b, c = run.generated
        counts[(a * 8 + b) * 8 + c] += 1
    return counts.numpy(), later_siblings


def law_holds(counts, exact) -> bool:
    """test_lossless's statistic on the joint law of three tokens, and on the first token's law alone (8
    outcomes, not 512: a bias in how one node's siblings are tried shows there at a few hundred runs)."""
    first, exact_first = counts.reshape(8, 8, 8).sum(axis=(1, 2)), exact.reshape(8, 8, 8).sum(axis=(1, 2))
    return (tv(counts, exact) < tv_threshold(exact, LAW_SAMPLES)
            and tv(first, exact_first) < tv_threshold(exact_first, LAW_SAMPLES))


LAW_CASES = [("tree:b=2,d=2", "temperature 1"), ("tree:b=2,d=2", "temperature 0.7, top-k 3"),
             ("tree:nodes=4,b=2,d=2", "temperature 1"), ("tree:b=2,d=3,w=1", "temperature 0.7, top-k 3"),
             ("tree:b=2,d=2", "top-p 0.8"), ("ngram;tree:b=2", "temperature 1")]
NGRAM_TREE_PROMPT = [4, 2, 5, 4, 2, 6, 4, 2]  # "4 2" was followed by 5 and by 6: a lookup tree of two branches


@pytest.mark.parametrize("options,cfg_name", LAW_CASES)
def test_sampled_trees_keep_the_target_law(fast_pair, options, cfg_name):
    """Static trees draw siblings from q without replacement (each node's law: q without its earlier
    siblings); dynamic trees and n-gram lookup's trees give each node a one-hot law. All through the same verify.
    (One node's sibling decisions are also checked exactly, by enumeration: test_sibling_law.py.)"""
    target, draft = fast_pair
    cfg = CASES[cfg_name]
    ngram = options.startswith("ngram")
    prompt = NGRAM_TREE_PROMPT if ngram else SMALL[:2]
    drafter = tree_drafter(None, options.split(";")[1]) if ngram else tree_drafter(draft, options)
    exact = exact_joint(target, cfg, 8, prompt=prompt)
    counts, later_siblings = tree_counts(target, drafter, cfg, prompt)
    assert later_siblings > LAW_SAMPLES // 5, "later siblings must be tried often, or the test says nothing of them"
    assert law_holds(counts, exact), f"{options}, {cfg_name}: output is not the target's law"


def test_siblings_tried_against_the_unmodified_p_are_caught(fast_pair, monkeypatch):
    """The tempting rule (each sibling tested against the target's own p, not against what the rejected
    siblings left; after the last, the residual of p alone) gives a biased law: the same test rejects it."""
    target, draft = fast_pair
    cfg = CASES["temperature 1"]
    monkeypatch.setattr(accept_rule, "sibling_target", lambda residual, p: p)
    exact = exact_joint(target, cfg, 8, prompt=SMALL[:2])
    counts, _ = tree_counts(target, tree_drafter(draft, "tree:nodes=4,b=2,d=2"), cfg, SMALL[:2])
    assert not law_holds(counts, exact)


@pytest.mark.parametrize("options", ["tree:b=2,d=1"] + SHAPES + ["ngram"])
def test_sampled_tree_steps_label_the_bonus_and_the_resample(fast_pair, options):
    """At temperature 1 a first sibling is often rejected and a later one accepted: when that one is a leaf, the
    extra token is the bonus from its row (not a resample, not a rejection one past `drafted`)."""
    target, draft = fast_pair
    drafter = tree_drafter(None, "tree:b=3") if options == "ngram" else tree_drafter(draft, options)
    prompt = [4, 2, 5, 4, 2, 6, 4, 2] if options == "ngram" else SMALL
    decoder = Decoder(target, drafter, CASES["temperature 1"], k=3, seed=5, ignore_eos=True)
    steps, sibling_then_bonus = [], 0
    for _ in range(6):
        for step in decoder.generate(prompt, 40):
            assert_step_labels(step)
            steps.append(step)
            if step.tree and step.rejected_at is None and step.tree["rejected"]:
                sibling_then_bonus += 1
    assert_counts_agree(steps)
    assert sum(s.rejected_at is not None for s in steps) > 2 and sum(s.bonus is not None for s in steps) > 2, "both ends"
    if options in ("tree:b=2,d=1", "tree:b=3,d=1"):
        assert sibling_then_bonus > 5, f"{sibling_then_bonus}: a rejected sibling followed by an accepted leaf must occur"


def test_tree_specs_parse_and_refuse():
    assert split_tree("smollm2-135m@int4;tree:b=2,d=4")[1].size(4) == 30
    assert [d.text for d in parse_drafts("smollm2-135m@int4;tree:b=2,d=4,ngram;tree")] == ["smollm2-135m@int4;tree:b=2,d=4", "ngram;tree"]
    assert split_tree("x;tree:nodes=16")[1].size(8) == 16 and parse_draft("ngram:max=3;tree:b=4").kind == "ngram"
    assert split_tree("x;tree:b=2,d=4,w=1")[1].size(4) == 8 and split_tree("x;tree:b=3,d=3,w=2")[1].size(3) == 3 + 6 + 6
    assert split_tree("x;tree:nodes=40,b=2,d=6")[1].size(6) == 2 + 4 + 4 + 4 + 4 + 4  # dynamic: w defaults to b
    assert split_tree("x;tree:b=2,w=1,min=0.05")[1].min == 0.05 and split_tree("x;tree:min=.5")[1].min == 0.5
    assert split_tree("gpt2") == ("gpt2", None) and parse_draft("self:skip=1-3;tree").kind == "self"
    # "²" and "٣" are digits to str.isdigit() but not to int(), nor are 5000 of them: these were tracebacks
    for bad in ("x;tree:b=0", "x;tree:b=99", "x;tree:q=1", "x;forest", ";tree", "ngram;tree:d=3", "x;tree:b=2,b=3",
                "x;tree:b=²", "x;tree:d=٣", "x;tree:w=0", "ngram;tree:w=1", "x;tree:min=0", "x;tree:min=1", "x;tree:min=nan",
                "x;tree:min=-0.5", "x;tree:min=.5,min=.2", "ngram;tree:min=0.1",
                "x;tree:min=٠.١", "x;tree:min=0.1_0", "x;tree:min=1e-2", "x;tree:min=inf", "x;tree:nodes=" + "1" * 5000, "x;tree:nodes=" + "0" * 5000 + "129"):
        with pytest.raises(SpecviewError, match="--draft"):
            parse_draft(bad)


def test_run_takes_a_tree_spec_and_records_the_tree(capsys, gpt2_paths):
    from helpers import run_cli

    draft = f"{gpt2_paths[1]};tree:b=2,d=3"
    code, out, err = run_cli(capsys, "run", "--target", gpt2_paths[0], "--draft", f"{draft},ngram;tree:b=2",
                             "--prompt", "w1 w2 w3", "-N", "16", "--jsonl", "-", "--temperature", "0", "--ignore-eos")
    assert code == 0, err
    steps = [json.loads(line) for line in out.splitlines() if '"type": "step"' in line or '"type":"step"' in line]
    trees_seen = [s["tree"] for s in steps if "tree" in s]
    assert trees_seen and all(len(t["tokens"]) == len(t["parents"]) == len(t["q"]) == len(t["p"]) for t in trees_seen)
    code, out, err = run_cli(capsys, "run", "--target", gpt2_paths[0], "--draft", f"{gpt2_paths[1]};tree:b=0")
    assert code == 2 and "tree b must be" in err and len(err.strip().splitlines()) == 1


def test_min_drafts_siblings_only_where_the_draft_is_unsure(loaded_pair):
    """min=P: a second or later child only when the draft gives its path at least P; the first children (the
    chain) are all drafted, and the tree is smaller where the draft is sure (fewer rows to verify)."""
    target, draft = loaded_pair
    greedy = SamplingConfig(temperature=0)
    sizes = {}
    for floor in (None, 0.02):
        options = "tree:b=3,d=3,w=1" + (f",min={floor}" if floor else "")
        steps = list(Decoder(target, tree_drafter(draft, options), greedy, k=3, ignore_eos=True).generate(PROMPT, 24))
        nodes = [s.tree for s in steps if s.tree]
        sizes[floor] = sum(len(t["tokens"]) for t in nodes) / max(len(steps), 1)
        if floor:
            for t in nodes:
                first = {}
                for j, parent in enumerate(t["parents"]):
                    if first.setdefault(parent, j) == j:
                        continue  # a first child: drafted whatever its probability
                    path_q = 1.0
                    for i in ancestry(t["parents"], j):
                        path_q *= t["q"][i]
                    assert path_q >= floor * (1 - 1e-5), (j, path_q)
        spines = [len(token_tree.spine(s.tree["parents"], [])) if s.tree else len(s.drafted) for s in steps]
        assert max(spines) == 3  # the chain of first children keeps its depth
    assert sizes[0.02] < sizes[None]
