"""`--record-dists`: the distributions along a run's emitted text, for `specview whatif` (analysis/whatif.py) to replay
other K, draft policies and drafters without running the models again (docs/design/whatif-and-calibrate.md).

After the run, one teacher-forced forward per model over prompt + generated tokens gives, at every emitted
position t, the target's p(. | tokens before t) and each model drafter's q(. | tokens before t), both
through sampling.probs_from_logits (the run's temperature, top-k, top-p; greedy: the softmax at
temperature 1, as the step records). Kept per position:

- target: its top TOP tokens and probabilities, and the tail mass (1 - their sum);
- a model drafter: the same of q (fed one token at a time, as the engine feeds it), its argmax (the
  engine's greedy choice: torch's first maximum, which the top-k order need not keep on exact ties), and `overlap` = sum_x min(p(x), q(x)) over the whole vocabulary: the exact
  probability that its token at t is accepted (Leviathan et al., Theorem 3.5's beta), which the top-k alone
  could not give;
- a drafter without a model (n-gram lookup: deterministic, and its block is not one token at a time):
  from every start position s its proposal of up to LOOKUP_MAX tokens, and the target's probability of
  each along the emitted text (a one-hot q is accepted with probability p(x)).

Greedy replay needs only the argmaxes (top_ids[...][0]), so it is exact; at temperature > 0 the replay is
exact per position given the recorded prefix (see analysis/whatif.py). One cost: a forward over the whole text per
model, after the timed run, and the file (`<stem>.dists.json.gz`, gzip'd JSON).
"""

from __future__ import annotations

import gzip
import json
import os

import torch

from specview.core.file_schemas import DISTS_SCHEMA
from specview.core.files import atomic_path

TOP = 8  # tokens kept per distribution
LOOKUP_MAX = 16  # the longest block kept per start position for a drafter without a model
DIGITS = 6  # probabilities rounded to this many decimals


def _round(rows: torch.Tensor) -> list:
    return [[round(x, DIGITS) for x in row] for row in rows.tolist()]


def _top(probs: torch.Tensor) -> dict:
    top = torch.topk(probs, min(TOP, probs.shape[-1]), dim=-1)
    return {"top_ids": top.indices.tolist(), "top_probs": _round(top.values),
            "tail": [round(max(0.0, 1.0 - x), DIGITS) for x in top.values.sum(-1).tolist()]}


@torch.inference_mode()
def teacher_forced(dec, lm, state, prompt_ids: list[int], generated: list[int]) -> torch.Tensor:
    """[len(generated), V] probabilities: row i is the model's law of generated[i] given what came before."""
    from specview.engine.sampling import probs_from_logits

    logits = dec.forward(lm, state, prompt_ids + generated[:-1], keep=len(generated))
    return probs_from_logits(logits, dec.sampling)


@torch.inference_mode()
def stepwise(dec, drafter, state, prompt_ids: list[int], generated: list[int]) -> torch.Tensor:
    """The same rows as teacher_forced, one token at a time as the engine's drafter feeds them: a one-row
    forward can run another kernel than a many-row one (the compiled one-row path; bfloat16 activations),
    and with near-equal tokens that changes the argmax. The greedy replay must see the engine's."""
    from specview.engine.sampling import probs_from_logits

    if hasattr(drafter, "logits_along_text"):  # a head that reads the target's states (drafters/eagle3.py)
        return probs_from_logits(drafter.logits_along_text(dec, prompt_ids, generated), dec.sampling)
    drafter.prefill(dec, state, prompt_ids[:-1])
    along = [prompt_ids[-1]] + generated[:-1]
    if getattr(drafter, "lm", None) is None:  # a draft model run elsewhere (llama.cpp): its own one-token feeds
        rows = drafter.logits_along(along).to(dec.device)
    else:
        rows = torch.stack([dec.forward(drafter.lm, state, [tok], keep=1)[-1] for tok in along])
    return probs_from_logits(rows, dec.sampling)


def verdicts(steps: list[dict], prompt_len: int, n: int) -> list:
    """Per emitted position, the run's own greedy verdict on its drafter's token there: 1 accepted, 0
    rejected, None not drafted with every earlier draft of its step accepted (off the emitted text)."""
    out: list = [None] * n
    for s in steps:
        t = (s.get("position") or 0) - prompt_len
        drafted, accepted = len(s.get("drafted") or []), s.get("accepted") or 0
        for i in range(min(drafted, accepted + 1)):
            if 0 <= t + i < n:
                out[t + i] = int(i < accepted)
    return out


def run_dists(session, prompt_ids: list[int], generated: list[int], steps: list[dict] | None = None) -> dict:
    """One run's record: the target's and every drafter's distributions along its tokens. With the run's
    steps (greedy), its own drafter also keeps the run's verdicts: a drafter's argmax can depend on how its
    cache was fed (one token, or two after a block accepted whole), so where the run tested a position its
    verdict is the engine's fact, and the replay of the run's own setting gives the run again."""
    dec = session.decoder("autoregressive")
    from specview.engine.kv_cache import new_cache

    p = teacher_forced(dec, session.target, new_cache(session.target), prompt_ids, generated)
    out = {"prompt_ids": list(prompt_ids), "tokens": list(generated), "target": {**_top(p), "argmax": p.argmax(dim=-1).tolist()},
           "drafters": {}}
    for d in session.drafters:
        if getattr(d, "lm", None) is not None or hasattr(d, "logits_along") or hasattr(d, "logits_along_text"):
            ddec = session.decoder(drafter=d)
            q = stepwise(ddec, d, d.new_state(), prompt_ids, generated)
            q = q[:, : p.shape[-1]] if q.shape[-1] >= p.shape[-1] else torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1]))
            out["drafters"][d.spec] = {"kind": "model", **_top(q), "argmax": q.argmax(dim=-1).tolist(),
                                       "overlap": [round(x, DIGITS) for x in torch.minimum(p, q).sum(-1).tolist()]}
            # A tree's step records its spine, whose last node may be a sibling: no verdict of the draft's argmax.
            if steps and d is session.drafters[0] and session.settings.sampling.greedy and getattr(d, "shape", None) is None:
                out["drafters"][d.spec]["verdicts"] = verdicts(steps, len(prompt_ids), len(generated))
        else:
            out["drafters"][d.spec] = {"kind": "lookup", **lookup_blocks(session, d, prompt_ids, generated, p)}
    return out


def lookup_blocks(session, drafter, prompt_ids: list[int], generated: list[int], p: torch.Tensor) -> dict:
    """Every start position's proposal (up to LOOKUP_MAX tokens) and p of each along the emitted text."""
    dec = session.decoder(drafter=drafter)
    tokens = list(prompt_ids) + list(generated)
    blocks, block_p = [], []
    for s in range(len(generated)):
        dec.timer.start_step()
        proposal = drafter.propose(dec, None, tokens[: len(prompt_ids) + s], min(LOOKUP_MAX, len(generated) - s))
        dec.timer.end_step()
        ids = proposal.tokens.tolist()
        blocks.append(ids)
        block_p.append([round(float(p[s + j, x]), DIGITS) for j, x in enumerate(ids)])
    return {"blocks": blocks, "block_p": block_p}


def record_dists(session, runs: list[tuple], path: str, profile_name: str) -> dict:
    """Write `path` (gzip'd JSON, atomically) for runs [(run index, prompt ids, generated ids, step records
    of the run or None)] -> its header (size and tokens) for the profile's meta."""
    s = session.settings
    doc = {"schema": DISTS_SCHEMA, "profile": profile_name, "top": TOP, "lookup_max": LOOKUP_MAX,
           "target": s.target, "drafters": [d.spec for d in session.drafters], "k": s.k,
           "max_new_tokens": s.max_new_tokens, "greedy": s.sampling.greedy,
           "sampling": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p},
           "runs": [{"run": index, **run_dists(session, prompt, generated, steps)}
                    for index, prompt, generated, steps in runs if generated]}
    with atomic_path(path, ".gz") as tmp:
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"), allow_nan=False)
    tokens = sum(len(r["tokens"]) for r in doc["runs"])
    size = os.path.getsize(path)
    return {"file": os.path.basename(path), "bytes": size, "tokens": tokens,
            "bytes_per_1000_tokens": round(size * 1000 / tokens) if tokens else None}
