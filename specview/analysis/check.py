"""`specview check`: does this pair, with these settings, produce the target's output?

Two tests, for every drafter of --draft:
- greedy equality: speculative decoding at temperature 0 emits autoregressive decoding's tokens, prompt by
  prompt. At a divergence it shows where, both tokens and the target's top-2 logit margin there: a margin
  within the float noise of the target's own logits (one batched forward against one token at a time,
  measured at that position) is a near-tie of float arithmetic, not a bug (transformers issue 39421).
- the distribution: M speculative steps from one prefix, each rewound, give M draws of the first emitted
  token; a chi-square test compares them with the target's exact next-token distribution at the user's
  temperature / top-k / top-p (bins: the tokens expected at least 5 times, plus one tail bin).
Exit 0 when both pass, 1 when either fails; the last line says so as key=value pairs for scripts.
"""

from __future__ import annotations

import math
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from rich.console import Console

from specview.analysis.check_report import passed, print_distribution, print_greedy, summary_line
from specview.core.prompt_sets import load_prompts as load_prompt_file
from specview.core.settings import SamplingConfig, Settings
from specview.core.stopping import Stop
from specview.engine.decoder import Decoder
from specview.engine.drafter import context_holders
from specview.engine.kv_cache import crop_cache, new_cache
from specview.engine.sampling import probs_from_logits
from specview.session import Session, check_context, encode_prompt, open_session

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
    p_value: float | None = None  # None: greedy (no distribution test) or no power
    statistic: float | None = None
    bins: int = 0
    note: str = ""

    @property
    def greedy_ok(self) -> bool:
        return all(d.near_tie for d in self.divergences)


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
    reference = Decoder(session.target, None, greedy, k=s.k, seed=s.seed, ignore_eos=s.ignore_eos)
    speculative = Decoder(session.target, drafter, greedy, k=s.k, seed=s.seed, ignore_eos=s.ignore_eos)
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


def first_token_draws(decoder: Decoder, prefix: list[int], samples: int, stop: Stop) -> tuple[list[int], int]:
    """-> (the first emitted token of `samples` speculative steps from `prefix`, tokens drafted in total)."""
    run = decoder.start(prefix, decoder.k + 1)
    draws, drafted = [], 0
    while len(draws) < samples and not stop:
        step = run.step()
        draws.append(step.emitted[0])
        drafted += len(step.drafted)
        rewind(run, len(prefix))
    return draws, drafted


def exact_distribution(decoder: Decoder, prefix: list[int]) -> list[float]:
    """The target's next-token distribution after `prefix`, through the engine's own sampling function, on the
    host (the chi-square's counts live there: a device tensor indexed by them, or they by its mask, fails)."""
    logits = decoder.forward(decoder.target, new_cache(decoder.target), prefix, keep=1)[-1]
    return probs_from_logits(logits, decoder.sampling).tolist()


def chi_square(draws: list[int], p) -> tuple[float | None, float | None, int, str]:
    """(statistic, p-value, bins, note) of the draws against p (a list, or a tensor on any device: read on the
    host); (None, None, ..) when the test has no power. Host arithmetic in Python floats (float64)."""
    p = p.tolist() if isinstance(p, torch.Tensor) else list(p)
    m = len(draws)
    counts = Counter(draws)
    impossible = sum(n for token, n in counts.items() if p[token] == 0)
    if impossible:
        return float("inf"), 0.0, 0, f"{impossible} draws of tokens the target gives probability 0"
    order = sorted(range(len(p)), key=lambda t: -p[t])
    top = [t for t in order[:MAX_BINS] if m * p[t] >= MIN_EXPECTED]
    while top and m * (1 - sum(p[t] for t in top)) < MIN_EXPECTED and len(top) > 1:
        top.pop()  # the tail must expect 5 draws too: it takes the smallest bin
    tail_p = 1 - sum(p[t] for t in top)
    expected = [m * p[t] for t in top]
    observed = [float(counts[t]) for t in top]
    if m * tail_p >= MIN_EXPECTED:
        expected.append(m * tail_p)
        observed.append(m - sum(observed))
    if len(expected) < 2:
        return None, None, len(expected), (f"the target's distribution here is nearly one token (p {max(p):.4f}): "
                                           "no power; raise --temperature or change --prompt")
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return stat, chi_square_tail(stat, len(expected) - 1), len(expected), ""


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
    decoder = Decoder(session.target, drafter, s.sampling, k=s.k, seed=s.seed, ignore_eos=True)
    draws, drafted = first_token_draws(decoder, prefix, 1, stop)
    if not drafted:  # nothing proposed here (n-gram lookup without a match): repeat the prompt's start
        prefix = prefix + prefix[: max(1, len(prefix) // 2)]
        result.note = "the drafter proposed nothing after the prompt: the prefix is the prompt + its first half; "
    draws, drafted = first_token_draws(decoder, prefix, samples, stop)
    if not drafted:
        result.note += "the drafter proposed nothing at this prefix: the test sees plain target sampling; "
    stat, pv, bins, note = chi_square(draws, exact_distribution(decoder, prefix))
    result.statistic, result.p_value, result.bins = stat, pv, bins
    result.note += note
    return prefix


def check_command(args) -> int:
    settings = Settings.from_args(args)
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)  # a pipe or file gets whole lines, not 80 columns
    say = Console(stderr=True, highlight=False)
    texts = load_prompts(args.prompts, settings.prompt)  # a bad file fails before the models load
    stop = Stop()
    with stop.on_signals():
        with say.status("loading models…") if say.is_terminal else nullcontext() as status:
            with stop.immediately():
                session = open_session(settings, (lambda m: status.update(m + "…")) if status else None)
        tok = session.target.tokenizer
        prompts = [encode_prompt(tok, text, settings.chat) for text in texts]
        for ids in prompts:
            check_context(context_holders(session.target, session.drafters), len(ids),
                          settings.max_new_tokens)
        s = settings
        console.print(f"specview check: target {s.target}, K {s.k}, temperature {s.temperature}, top-k "
                      f"{s.top_k or 'off'}, top-p {s.top_p if s.top_p < 1 else 'off'}, seed {s.seed}; greedy over "
                      f"{len(prompts)} prompts x {s.max_new_tokens} tokens; distribution from {args.samples} samples")
        results = []
        for drafter in session.drafters:
            result = DrafterResult(drafter.spec)
            results.append(result)
            with say.status(f"{drafter.spec}: greedy") if say.is_terminal else nullcontext():
                check_greedy(session, drafter, prompts, s.max_new_tokens, result, stop)
            print_greedy(console, result, texts, tok)
            prefix = prompts[0]
            if not s.greedy and not stop:
                with say.status(f"{drafter.spec}: {args.samples} samples") if say.is_terminal else nullcontext():
                    prefix = check_distribution(session, drafter, prompts[0], args.samples, result, stop)
            print_distribution(console, result, prefix, tok, args.threshold, s.greedy)
    console.print(summary_line(results, args.threshold, s.greedy), soft_wrap=True)
    if stop:
        return 130
    return 0 if passed(results, args.threshold) else 1

