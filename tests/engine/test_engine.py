"""Engine behaviour on tiny GPT-2 and Llama pairs: greedy equality, caches, stops, metrics."""

import pytest
import torch

import tiny
from specview.core.errors import SpecviewError
from specview.core.events import RunSummary
from specview.core.metrics import expected_tokens_per_step
from specview.core.settings import SamplingConfig
from specview.engine.decoder import Decoder
from specview.models.loader import load_model, load_pair

CPU = torch.device("cpu")
PROMPT = [1, 4, 7, 9]
GREEDY = SamplingConfig(temperature=0)


def generate(target, draft, cfg, n=30, k=4, seed=0, ignore_eos=True, prompt=PROMPT):
    decoder = Decoder(target, draft, cfg, k=k, seed=seed, ignore_eos=ignore_eos)
    run = decoder.start(prompt, n)
    steps = []
    while not run.done:
        steps.append(run.step())
    return run, steps


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_speculative_equals_greedy_autoregressive(loaded_pair, k):
    target, draft = loaded_pair
    ar, _ = generate(target, None, GREEDY)
    spec, steps = generate(target, draft, GREEDY, k=k)
    assert spec.generated == ar.generated
    assert len(spec.generated) == 30
    assert any(s.rejected_at is not None for s in steps), "unrelated models should disagree somewhere"
    assert all(s.r is None for s in steps if s.drafted)  # greedy: no uniform draws


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_target_as_its_own_draft_is_never_rejected(loaded_pair, temperature):
    target, _ = loaded_pair
    for seed in range(3):
        run, steps = generate(target, target, SamplingConfig(temperature=temperature), n=40, k=4, seed=seed)
        assert run.summary.rejections == 0
        assert run.summary.acceptance_rate == 1.0
        assert all(s.bonus is not None for s in steps)


def test_caches_stay_in_step_with_a_fresh_forward(loaded_pair):
    """After many steps with rejections, the cached logits equal a full-prefix forward."""
    target, draft = loaded_pair
    decoder = Decoder(target, draft, SamplingConfig(temperature=1.0), k=4, seed=5, ignore_eos=True)
    run = decoder.start(PROMPT, 60)
    rejections = 0
    while not run.done:
        step = run.step()
        rejections += step.rejected_at is not None
        # Invariant: the target's cache holds all tokens but the last; the draft's never holds more, and
        # after a step that drafted it lags by at most one more (the last draft, fed with the bonus).
        assert run.target_cache.get_seq_length() == len(run.tokens) - 1
        assert run.draft_cache.get_seq_length() <= len(run.tokens) - 1
        if step.drafted:
            assert run.draft_cache.get_seq_length() >= len(run.tokens) - 2
    assert rejections >= 2
    for lm, cache in ((target, run.target_cache), (draft, run.draft_cache)):
        fed = run.tokens[cache.get_seq_length() :]
        cached = decoder.forward(lm, cache, fed)[-1]
        with torch.no_grad():
            full = lm.model(torch.tensor([run.tokens])).logits[0, -1, : decoder.vocab]
        torch.testing.assert_close(cached, full, atol=1e-4, rtol=1e-4)


def test_step_records_are_consistent(loaded_pair):
    target, draft = loaded_pair
    run, steps = generate(target, draft, SamplingConfig(temperature=1.0), n=50, k=3, seed=2)
    for s in steps:
        assert len(s.q) == len(s.p) == len(s.r) == len(s.drafted) <= 3
        assert all(0 < q <= 1 for q in s.q)
        assert s.emitted[: s.accepted] == s.drafted[: s.accepted]
        if s.rejected_at is not None:
            assert s.rejected_at == s.accepted and s.bonus is None
            assert s.emitted[-1] == s.resampled and len(s.residual_top) == 5
            top = [prob for _, prob in s.residual_top]
            assert top == sorted(top, reverse=True) and 0 < sum(top) <= 1 + 1e-6
            # the rejected token can never be resampled: the residual puts no mass on it
            assert s.resampled != s.drafted[s.rejected_at]
            # r >= p/q at the rejection, r < p/q before it (the strict rule: p = 0 never keeps x)
            assert s.r[s.rejected_at] * s.q[s.rejected_at] >= s.p[s.rejected_at]
        else:  # the residual's top is computed at a rejection only
            assert s.residual_top is None
        if s.rejected_at is None and s.stop_reason is None:
            assert s.bonus == s.emitted[-1] and s.accepted == len(s.drafted)
        assert all(s.r[i] * s.q[i] < s.p[i] for i in range(s.accepted))
        assert set(s.phases_ms) >= {"draft", "verify", "sample", "cache", "other", "softmax", "layernorm"}
        assert s.phases_ms["other"] >= 0
        assert len(s.tokens) == len(s.emitted)
    assert sum(len(s.emitted) for s in steps) == len(run.generated) == 50
    assert run.summary.stop_reason == "length"


def test_k_changes_between_steps(loaded_pair):
    target, draft = loaded_pair
    decoder = Decoder(target, draft, GREEDY, k=2, ignore_eos=True)
    run = decoder.start(PROMPT, 40)
    assert len(run.step().drafted) == 2
    assert len(run.step(k=6).drafted) == 6
    assert len(run.step().drafted) == 6  # K stays as the last step set it
    ar, _ = generate(target, None, GREEDY, n=40)
    while not run.done:
        run.step()
    assert run.generated == ar.generated


def test_no_drafting_past_n(loaded_pair):
    target, draft = loaded_pair
    run, steps = generate(target, draft, GREEDY, n=3, k=8)
    assert len(run.generated) == 3
    assert len(steps[0].drafted) == 2  # the 3rd token comes from the target


def test_stops_at_eos_unless_ignored(tiny_dir):
    tok = tiny.make_tokenizer(16)
    # A target that always prefers EOS (id 2) after a few tokens: bias its output layer.
    model = tiny.make_model("llama", 16, 3, scale=1.0)
    with torch.no_grad():
        model.get_output_embeddings().weight[2] += 0.5
    path = tiny.save(model, tok, tiny_dir / "eos-lover")
    target, draft = load_pair(path, path, CPU)
    run, steps = generate(target, draft, SamplingConfig(temperature=1.0), n=50, ignore_eos=False)
    assert run.stop_reason == "eos" and run.generated[-1] == 2 and 2 not in run.generated[:-1]
    assert steps[-1].stop_reason == "eos"
    run, _ = generate(target, draft, SamplingConfig(temperature=1.0), n=50, ignore_eos=True)
    assert len(run.generated) == 50 and run.stop_reason == "length"


def test_never_runs_past_the_context(tiny_dir):
    tok = tiny.make_tokenizer(16)
    path = tiny.save(tiny.make_model("gpt2", 16, 4, n_positions=20), tok, tiny_dir / "short-ctx")
    target, draft = load_pair(path, path, CPU)
    run, steps = generate(target, draft, SamplingConfig(temperature=1.0), n=100, k=6)
    assert run.stop_reason == "context"
    assert len(run.tokens) == 20
    # 4 + 7 + 7 = 18 tokens, then only 1 draft fits (it and the target's token make 20)
    assert [len(s.drafted) for s in steps] == [6, 6, 1]


def test_padded_embedding_is_sliced_to_the_tokenizer(tiny_dir):
    """Embeddings padded past the tokenizer (like 50257 vs 50304) must never yield an id past it."""
    tok = tiny.make_tokenizer(16)
    padded = tiny.make_model("gpt2", 16, 0, scale=4.0, logits_dim=24)
    with torch.no_grad():  # make the padding rows attractive, so slicing is what keeps them out
        padded.get_output_embeddings().weight[16:] = padded.get_output_embeddings().weight[:8] * 3
    target = load_model(tiny.save(padded, tok, tiny_dir / "padded"), CPU)
    draft = load_model(tiny.save(tiny.make_model("gpt2", 16, 1, scale=4.0), tok, tiny_dir / "unpadded"), CPU)
    assert target.logits_dim == 24
    for d in (draft, None):
        run, _ = generate(target, d, SamplingConfig(temperature=1.0), n=40)
        assert max(run.generated) < 16


def test_a_draft_with_another_tokenizer_is_refused(tiny_dir, gpt2_paths):
    other = tiny.save(tiny.make_model("gpt2", 16, 1), tiny.make_tokenizer(16, prefix="v"), tiny_dir / "other-vocab")
    with pytest.raises(SpecviewError, match="different tokenizers"):
        load_pair(gpt2_paths[0], other, CPU)


@pytest.mark.parametrize("kind", ["opt", "bloom"])
def test_other_families_run_greedy_equal(tiny_dir, kind):
    """OPT (learned positions with an offset) and Bloom (ALiBi, no context limit) through the same path."""
    from transformers import BloomConfig, BloomForCausalLM, OPTConfig, OPTForCausalLM

    tok = tiny.make_tokenizer(16)
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        if kind == "opt":
            cfg = OPTConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
                            max_position_embeddings=128, word_embed_proj_dim=32, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0)
            model = OPTForCausalLM(cfg)
        else:
            model = BloomForCausalLM(BloomConfig(vocab_size=16, hidden_size=32, n_layer=2, n_head=2,
                                                 bos_token_id=1, eos_token_id=2, pad_token_id=0))
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(30)
        paths.append(tiny.save(model.eval(), tok, tiny_dir / f"{kind}-{seed}"))
    target, draft = load_pair(*paths, CPU)
    assert (target.context_len is None) == (kind == "bloom")
    ar, _ = generate(target, None, GREEDY, n=20)
    spec, steps = generate(target, draft, GREEDY, n=20, k=3)
    assert spec.generated == ar.generated


def test_summary_metrics_follow_the_design_conventions():
    from specview.core.events import StepResult

    summary = RunSummary()
    common = dict(q=[], p=[], r=None, residual_top=None)
    summary.add(StepResult(step=0, drafted=[5, 6, 7, 8], accepted=2, rejected_at=2, resampled=3, bonus=None,
                           emitted=[5, 6, 3], **common))
    summary.add(StepResult(step=1, drafted=[1, 2, 3, 4], accepted=4, rejected_at=None, resampled=None, bonus=9,
                           emitted=[1, 2, 3, 4, 9], **common))
    assert summary.acceptance_rate == 6 / 8
    assert summary.alpha == 6 / 7  # one rejection examined
    assert summary.mean_emitted_per_step == 8 / 2
    assert summary.per_position_acceptance == [1.0, 1.0, 0.5, 0.5]
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    assert RunSummary().to_json()["acceptance_rate"] is None  # no NaN: null


def test_runs_share_one_generator_and_are_reproducible(loaded_pair):
    target, draft = loaded_pair
    cfg = SamplingConfig(temperature=1.0)

    def two_runs(seed):
        decoder = Decoder(target, draft, cfg, k=3, seed=seed, ignore_eos=True)
        return [[t for s in decoder.generate(PROMPT, 15) for t in s.emitted] for _ in range(2)]

    first, second = two_runs(7)
    assert first != second  # the second run continues the generator: an independent sample
    assert two_runs(7) == [first, second]  # and the whole thing is reproducible


def test_one_source_in_two_dtypes_is_never_cast_twice(gpt2_paths):
    path = gpt2_paths[0]
    target, draft = load_pair(path + "@bfloat16", path, CPU)
    assert (target.dtype, draft.dtype) == (torch.bfloat16, torch.float32)
    target, draft = load_pair(path, path + "@bfloat16", CPU)
    assert (target.dtype, draft.dtype) == (torch.float32, torch.bfloat16)
    target, draft = load_pair(path, path, CPU)
    assert target.model is draft.model  # same spec twice: one model, two caches


# 1e-40 and 1e-320 are 0 as float32 (the logits' type): 0 / 0 made NaN rows, which drew the last token of the
# vocabulary every time (a request with "temperature": 1e-320 got id V-1 over and over). A top_p of 5e-324 is 0
# in float32 too, and dropped even the first token.
@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1e-30), SamplingConfig(temperature=1e-40),
                                 SamplingConfig(temperature=1e-320), SamplingConfig(temperature=1e-320, top_k=3),
                                 SamplingConfig(temperature=1.0, top_p=5e-324), SamplingConfig(top_p=1e-40)],
                         ids=["T=1e-30", "T=1e-40", "T=1e-320", "T=1e-320,top_k=3", "top_p=5e-324", "top_p=1e-40"])
def test_a_tiny_temperature_or_top_p_is_greedy_not_nan(loaded_pair, cfg):
    target, draft = loaded_pair
    greedy, _ = generate(target, None, GREEDY, n=20)
    cold, steps = generate(target, draft, cfg, n=20)
    assert cold.generated == greedy.generated
    assert all(0 < q <= 1 for s in steps for q in s.q)


def test_drafts_after_an_accepted_eos_do_not_count(tiny_dir):
    """Target == draft never rejects, EOS included: drafts past an accepted EOS were never tested."""
    tok = tiny.make_tokenizer(16)
    model = tiny.make_model("llama", 16, 3, scale=1.0)
    with torch.no_grad():
        model.get_output_embeddings().weight[2] += 0.5  # EOS (id 2) becomes likely
    path = tiny.save(model, tok, tiny_dir / "eos-lover-2")
    target, _ = load_pair(path, None, CPU)
    cut_inside_block = 0
    for seed in range(5):
        run, steps = generate(target, target, SamplingConfig(temperature=1.0), n=50, k=6, seed=seed,
                              ignore_eos=False)
        assert run.stop_reason == "eos"
        assert run.summary.acceptance_rate == 1.0 and run.summary.rejections == 0
        last = steps[-1]
        assert len(last.drafted) == len(last.q) == len(last.r) == last.accepted or last.bonus == 2
        cut_inside_block += bool(last.drafted) and last.drafted[-1] == 2 and last.bonus is None
    assert cut_inside_block > 0  # the case under test happened


def test_greedy_speculative_step_without_drafts_has_null_r(loaded_pair):
    target, draft = loaded_pair
    _, steps = generate(target, draft, GREEDY, n=1, k=4)
    assert steps[0].drafted == [] and steps[0].r is None
    _, steps = generate(target, None, GREEDY, n=1)
    assert steps[0].r == []


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=5),
                                 GREEDY])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_the_host_walk_decides_as_the_device_walk_bit_for_bit(cfg, shape):
    """On the CPU the nodes are walked in Python (a residual only where a tried node is rejected); the device walk
    (every node's residual, branch-free) remains for other devices. Both must draw the same numbers in the same
    order and give the same decision, for chains and trees, including the degenerate cases: a draft equal to the
    target (no residual mass), drafts with q = 1, every node accepted, the first rejected, siblings rejected in
    turn."""
    from specview.engine import decoder
    from specview.engine.drafter import Proposal
    from specview.engine.phase_timer import PhaseTimer
    from specview.engine.sampling import probs_from_logits

    vocab, seen_rejection, seen_all, seen_sibling = 6, set(), False, False
    for case in range(300):
        g = torch.Generator().manual_seed(case)
        n = 1 + case % 7
        if shape == "chain":
            parents = list(range(-1, n - 1))
        else:  # each node under a random earlier node or the root
            parents = [int(torch.randint(-1, j, (1,), generator=g)) for j in range(n)]
        logits = torch.randn(n + 1, vocab, generator=g) * (1 + case % 3)
        above = torch.tensor([parent + 1 for parent in parents])
        q_logits = logits[above] if case % 7 == 0 else torch.randn(n, vocab, generator=g) * 3  # q = p sometimes
        if case % 11 == 0:
            q_logits = torch.full((n, vocab), -1e9).index_fill_(1, torch.tensor([0]), 0.0)  # q puts all on token 0
        q = probs_from_logits(q_logits, cfg)
        drafts = torch.multinomial(q, 1, generator=g).view(-1)
        proposal = Proposal(drafts, q, parents=None if shape == "chain" else parents)
        walks = []
        for host in (True, False):
            dec = type("Dec", (), {})()
            dec.sampling, dec.device, dec.timer = cfg, CPU, PhaseTimer(CPU)
            dec.generator = torch.Generator().manual_seed(1000 + case)
            run = decoder.Run.__new__(decoder.Run)
            run.dec, run.sampling, run.generator = dec, dec.sampling, dec.generator
            decision = run._decide(logits, proposal, host=host)
            walks.append((vars(decision), dec.generator.get_state()))
        (host_decision, host_rng), (device_decision, device_rng) = walks
        assert host_decision == device_decision, case
        assert torch.equal(host_rng, device_rng), case  # the same draws consumed
        path, tried = host_decision["path"], host_decision["tried"]
        last = path[-1] if path else -1
        if not any(tried[j] for j in range(n) if parents[j] == last):
            seen_all = True  # no child of the last accepted node was tried: the bonus row
        else:
            seen_rejection.add(len(path))  # every tried child of it rejected: the residual
        tried_parents = [parents[j] for j in range(n) if tried[j]]
        seen_sibling |= len(tried_parents) > len(set(tried_parents))
    assert seen_all and seen_rejection >= {0, 1}, "the cases must reach both ends of the walk"
    assert shape == "chain" or seen_sibling, "a tree's cases must try a second sibling"
