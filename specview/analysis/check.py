"""`specview check`: does this pair, with these settings, produce the target's output?

Two tests, for every drafter of --draft:
- greedy equality: speculative decoding at temperature 0 emits autoregressive decoding's tokens, prompt by
  prompt. At a divergence it shows where, both tokens and the target's top-2 logit margin there: a margin
  within the float noise of the target's own logits (one batched forward against one token at a time,
  measured at that position) is a near-tie of float arithmetic, not a bug (transformers issue 39421).
- the distribution: M speculative steps from one prefix, each rewound, give M draws of the first emitted
  token; a chi-square test compares them with the target's exact next-token distribution at the user's
  temperature / top-k / top-p (bins: the tokens expected at least 5 times, plus one tail bin). The tokens each
  step emits after its first (accepted drafts, and the bonus after all K: the path the first token never takes)
  are tested too, each against the target's law given the tokens before it (bins: ranks in that law).
Exit 0 (result=pass) when both pass, 1 (result=fail) when either fails, 3 (result=inconclusive) when nothing failed
but the distribution could not be tested: no power (a near one-token law) or the drafter proposed nothing, so the
draws measured the target alone. The last line says so as key=value pairs for scripts.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import torch

from specview.core.prompt_sets import load_prompts as load_prompt_file
from specview.core.settings import SamplingConfig
from specview.core.stopping import Stop
from specview.engine.decoder import Decoder
from specview.engine.kv_cache import crop_cache, new_cache
from specview.engine.sampling import probs_from_logits
from specview.session import Session

QUICK = "quick"  # the default set: --prompt and these three, a few seconds of greedy decoding each
QUICK_PROMPTS = ("The three primary colors are", "def fibonacci(n):", "Q: What is the capital of France?\nA:")
MIN_EXPECTED = 5  # chi-square's usual rule: every bin expects at least 5 draws
MAX_BINS = 30
NOISE_FACTOR = 4  # a margin within 4x the measured float noise of the logits is a near-tie


@dataclass
class Divergence:
    prompt: int
    position: int  # index into the generated tokens
    autoregressive: int
    speculative: int
    margin: float  # target's top-1 minus top-2 logit at that position
    noise: float  # max |logits of one batched forward - logits one token at a time| there
    near_tie: bool


@dataclass
class DrafterResult:
    spec: str
    prompts: int = 0
    same: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    p_value: float | None = None  # None: greedy (no distribution test) or no power; else both tests' (Bonferroni)
    statistic: float | None = None
    bins: int = 0
    note: str = ""
    tested: bool = False  # the distribution test ran (not greedy, not interrupted before it)
    drafted: int = 0  # tokens the drafter proposed over the distribution draws
    first_p: float | None = None  # the first emitted token's test
    later_p: float | None = None  # the later tokens' test (None: none emitted, or no power)
    later_tokens: int = 0  # tokens tested past the first, of which `bonuses` were a bonus
    bonuses: int = 0

    @property
    def greedy_ok(self) -> bool:
        return all(d.near_tie for d in self.divergences)

    @property
    def inconclusive(self) -> bool:
        """The distribution test ran but could not tell: no power, or no draft to judge (the target alone)."""
        return self.tested and (self.p_value is None or self.drafted == 0)


def load_prompts(spec: str, first: str) -> list[str]:
    """`quick`: `--prompt` and QUICK_PROMPTS; otherwise eval's prompt sets (`builtin`, a Spec-Bench
    question.jsonl, JSONL of {"prompt"}, a text file: core/prompt_sets.py, the one home of prompt sets)."""
    if spec == QUICK:
        return [first, *QUICK_PROMPTS]
    return [p.text for p in load_prompt_file(spec)]


def greedy_generate(decoder: Decoder, ids: list[int], n: int, stop: Stop) -> list[int]:
    run = decoder.start(ids, n)
    while not run.done and not stop:
        run.step()
    return run.generated


def logit_margin(decoder: Decoder, prefix: list[int]) -> tuple[float, float]:
    """(top-1 minus top-2 logit of the target after `prefix`, the float noise there): the logits of one
    forward over the whole prefix against those of the prefix's last token fed on its own. Read on the host as
    Python floats (float64: the float32 logits' differences exactly; MPS has no float64 on the device)."""
    target = decoder.target
    whole = decoder.forward(target, new_cache(target), prefix, keep=1)[-1].float().tolist()
    cache = new_cache(target)
    if len(prefix) > 1:
        decoder.forward(target, cache, prefix[:-1], keep=1)
    single = decoder.forward(target, cache, prefix[-1:], keep=1)[-1].float().tolist()
    top = sorted(whole, reverse=True)[:2]
    return top[0] - top[1], max(abs(a - b) for a, b in zip(whole, single))


def check_greedy(session: Session, drafter, prompts: list[list[int]], n: int, result: DrafterResult,
                 stop: Stop) -> None:
    greedy = SamplingConfig(0.0)
    s = session.settings
    reference = Decoder(session.target, None, greedy, k=s.k, seed=s.seed, ignore_eos=s.ignore_eos,
                        between_steps=session.between_steps)
    speculative = Decoder(session.target, drafter, greedy, k=s.k, seed=s.seed, ignore_eos=s.ignore_eos,
                          between_steps=session.between_steps)
    for i, ids in enumerate(prompts):
        if stop:
            return
        ar, spec = greedy_generate(reference, ids, n, stop), greedy_generate(speculative, ids, n, stop)
        result.prompts += 1
        at = next((j for j in range(min(len(ar), len(spec))) if ar[j] != spec[j]), None)
        if at is None and len(ar) == len(spec):
            result.same += 1
            continue
        at = min(len(ar), len(spec)) if at is None else at
        margin, noise = logit_margin(reference, ids + ar[:at])
        tie = margin <= NOISE_FACTOR * noise
        result.divergences.append(Divergence(i, at, ar[at] if at < len(ar) else -1,
                                             spec[at] if at < len(spec) else -1, margin, noise, tie))


def rewind(run, n: int) -> None:
    """Back to the first `n` tokens (the prefix), caches included, as if the step had not run: a new run
    per draw would prefill the prompt again each time. The same cropping the engine does after a step."""
    del run.tokens[n:]
    crop_cache(run.target_cache, n - 1)
    drafter = run.dec.drafter
    drafter.rollback(run._state(drafter), n - 1)
    run.done, run.stop_reason = False, None


def step_draws(decoder: Decoder, prefix: list[int], samples: int, stop: Stop) -> tuple[list[list[int]], int, int]:
    """-> (the tokens each of `samples` speculative steps from `prefix` emitted, tokens drafted in total, steps that
    ended in a bonus)."""
    run = decoder.start(prefix, decoder.k + 1)
    draws, drafted, bonuses = [], 0, 0
    while len(draws) < samples and not stop:
        step = run.step()
        draws.append(list(step.emitted))
        drafted += len(step.drafted)
        bonuses += bool(step.drafted) and step.bonus is not None
        rewind(run, len(prefix))
    return draws, drafted, bonuses


def first_token_draws(decoder: Decoder, prefix: list[int], samples: int, stop: Stop) -> tuple[list[int], int]:
    """-> (the first emitted token of `samples` speculative steps from `prefix`, tokens drafted in total)."""
    draws, drafted, _ = step_draws(decoder, prefix, samples, stop)
    return [d[0] for d in draws], drafted


def later_observations(decoder: Decoder, prefix: list[int], draws: list[list[int]]):
    """(the target's law, the tokens that must follow it) for every token a step emitted after its first. Given the
    tokens before it in its step (accepted drafts), the token at position i is distributed as the target's
    next-token law after prefix + those tokens, whether it is an accepted draft, a resample or the bonus (after all
    K): the acceptance of the earlier drafts depends on them and their own uniforms only. The laws come from the
    target's own forward over each distinct emitted sequence (not the engine's verify rows), through
    probs_from_logits; yielded one sequence at a time (a vocabulary-wide row per token would not all fit)."""
    target = decoder.target
    cache = new_cache(target)
    if len(prefix) > 1:
        decoder.forward(target, cache, prefix[:-1], keep=1)
    base = cache.get_seq_length()
    for emitted, count in Counter(tuple(d) for d in draws if len(d) > 1).items():
        logits = decoder.forward(target, cache, prefix[-1:] + list(emitted[:-1]), keep=len(emitted))
        crop_cache(cache, base)
        laws = probs_from_logits(logits, decoder.sampling)  # row i: the law after emitted[:i]
        for i in range(1, len(emitted)):
            yield laws[i], [emitted[i]] * count


def exact_distribution(decoder: Decoder, prefix: list[int]) -> list[float]:
    """The target's next-token distribution after `prefix`, through the engine's own sampling function, on the
    host (the chi-square's counts live there: a device tensor indexed by them, or they by its mask, fails)."""
    logits = decoder.forward(decoder.target, new_cache(decoder.target), prefix, keep=1)[-1]
    return probs_from_logits(logits, decoder.sampling).tolist()


def chi_square(draws: list[int], p: torch.Tensor) -> tuple[float | None, float | None, int, str]:
    """(statistic, p-value, bins, note) of the draws against p; (None, None, ..) when the test has no power."""
    return chi_square_conditional([(p, draws)])


def chi_square_conditional(observations) -> tuple[float | None, float | None, int, str]:
    """(statistic, p-value, bins, note) of tokens each drawn from its own law: `observations` yields (law, tokens
    drawn from it). Bin r holds the tokens that were the r-th likeliest of their law, and expects the sum of those
    laws' r-th largest probabilities; the bins are the ranks expected at least 5 times (at most MAX_BINS) plus a
    tail bin. With one law (chi_square) the bins are its likeliest tokens. (None, None, ..) without power."""
    # Host arithmetic in Python floats: no float64 tensor (MPS has none), a device's law read once (tolist).
    expected = [0.0] * (MAX_BINS + 1)  # the last: every rank past MAX_BINS
    observed = [0] * (MAX_BINS + 1)
    m, impossible = 0, 0
    for law, tokens in observations:
        if isinstance(law, torch.Tensor):
            probs, ranked = law.tolist(), law.detach().to("cpu")
        else:
            probs = list(law)
            ranked = torch.tensor(probs)
        order = torch.argsort(ranked, descending=True, stable=True)
        top = [probs[t] for t in order[:MAX_BINS].tolist()]
        n = len(tokens)
        for r, value in enumerate(top):
            expected[r] += n * value
        expected[MAX_BINS] += n * max(0.0, math.fsum(probs) - math.fsum(top))
        rank_of = torch.empty_like(order)
        rank_of[order] = torch.arange(order.shape[0])
        impossible += sum(1 for t in tokens if probs[t] == 0)
        for r in rank_of[torch.tensor(tokens, dtype=torch.long)].clamp(max=MAX_BINS).tolist():
            observed[r] += 1
        m += n
    if not m:
        return None, None, 0, "nothing to test; "
    if impossible:
        return float("inf"), 0.0, 0, f"{impossible} draws of tokens the target gives probability 0"
    scale = m / math.fsum(expected)  # each law sums to 1 up to float rounding
    expected = [e * scale for e in expected]
    bins = [r for r in range(MAX_BINS) if float(expected[r]) >= MIN_EXPECTED]
    while bins and m - math.fsum(expected[r] for r in bins) < MIN_EXPECTED and len(bins) > 1:
        bins.pop()  # the tail must expect 5 draws too: it takes the smallest bin
    want = [float(expected[r]) for r in bins]
    got = [float(observed[r]) for r in bins]
    if m - sum(want) >= MIN_EXPECTED:
        want.append(m - sum(want))
        got.append(m - sum(got))
    if len(want) < 2:
        return None, None, len(want), (f"the target's distribution here is nearly one token (expected at its likeliest: "
                                       f"{float(expected[0]) / m:.4f}): no power; raise --temperature or change --prompt")
    stat = sum((o - e) ** 2 / e for o, e in zip(got, want))
    return stat, chi_square_tail(stat, len(want) - 1), len(want), ""


def chi_square_tail(stat: float, dof: int) -> float:
    """P(X >= stat) for X chi-square with `dof` degrees of freedom: the regularized upper incomplete gamma
    Q(dof/2, stat/2), in Python floats (no scipy, whose import transformers would then pay at every start; no
    float64 tensor, which MPS lacks): the series of P below a + 1, Lentz's continued fraction of Q above."""
    a, x = dof / 2, stat / 2
    if x <= 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    scale = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1:
        term = total = 1 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-17:
                break
        return max(0.0, 1.0 - total * scale)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        step = d * c
        h *= step
        if abs(step - 1) < 1e-16:
            break
    return scale * h


def check_distribution(session: Session, drafter, prefix: list[int], samples: int, result: DrafterResult,
                       stop: Stop) -> list[int]:
    s = session.settings
    decoder = Decoder(session.target, drafter, s.sampling, k=s.k, seed=s.seed, ignore_eos=True,
                      between_steps=session.between_steps)
    draws, drafted = first_token_draws(decoder, prefix, 1, stop)
    if not drafted:  # nothing proposed here (n-gram lookup without a match): repeat the prompt's start
        prefix = prefix + prefix[: max(1, len(prefix) // 2)]
        result.note = "the drafter proposed nothing after the prompt: the prefix is the prompt + its first half; "
    draws, drafted, bonuses = step_draws(decoder, prefix, samples, stop)
    result.tested, result.drafted, result.bonuses = True, drafted, bonuses
    if not drafted:
        result.note += ("the drafter proposed nothing at this prefix: the draws measured the target alone, "
                        "not speculative decoding; ")
    stat, pv, bins, note = chi_square([d[0] for d in draws], exact_distribution(decoder, prefix))
    result.statistic, result.first_p, result.bins = stat, pv, bins
    result.note += note
    result.later_tokens = sum(len(d) - 1 for d in draws)
    if result.later_tokens:
        _, result.later_p, _, later_note = chi_square_conditional(later_observations(decoder, prefix, draws))
        if result.later_p is None and later_note:
            result.note += "the tokens past the first: " + later_note.rstrip("; ") + "; "
    # Two tests, one verdict: Bonferroni keeps a correct engine's chance of failing at the threshold
    tests = [v for v in (result.first_p, result.later_p) if v is not None]
    result.p_value = None if pv is None else min(1.0, len(tests) * min(tests))
    return prefix
