"""N-gram prompt lookup (Saxena's prompt lookup decoding, HF's `prompt_lookup_num_tokens`, vLLM's n-gram
proposer): find the most recent earlier occurrence of the last n tokens of prompt + output (n from `max`
down to `min`) and propose the tokens that followed it. No forward pass, so c is about 0.

The proposal is deterministic, so q is one-hot: the accept test keeps x with probability p(x), and on a
rejection the residual max(0, p - q) is p with x removed. The target's distribution is kept exactly.
"""

from __future__ import annotations

import torch

from specview.core.errors import SpecviewError, quoted
from specview.engine import device as devices
from specview.engine.drafter import Proposal

DEFAULT_MAX, DEFAULT_MIN = 4, 1


def parse_ngram_options(spec: str) -> tuple[int, int]:
    """'ngram' or 'ngram:max=4,min=1' -> (max, min); one clear line for anything else."""
    _, _, options = spec.partition(":")
    values = {"max": DEFAULT_MAX, "min": DEFAULT_MIN}
    for item in filter(None, options.split(",")):
        key, eq, text = item.partition("=")
        if key not in values or not eq:
            raise SpecviewError(f"--draft {quoted(spec)}: unknown ngram option {quoted(item)} (use max=N, min=N)")
        try:
            values[key] = int(text)
        except ValueError:
            raise SpecviewError(f"--draft {quoted(spec)}: ngram {key} must be an integer, got {quoted(text)}") from None
    if values["min"] < 1 or values["max"] < 1:
        raise SpecviewError(f"--draft {quoted(spec)}: ngram max and min must be >= 1")
    if values["min"] > values["max"]:
        raise SpecviewError(f"--draft {quoted(spec)}: ngram min ({values['min']}) is larger than max ({values['max']})")
    return values["max"], values["min"]


def lookup(tokens: list[int], k: int, max_n: int, min_n: int) -> tuple[int, list[int]] | None:
    """(start, continuation): the up to k tokens after the most recent earlier occurrence of the longest
    suffix of length max_n..min_n; None when no suffix occurs earlier."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = tokens[length - n:]
        last = tail[-1]
        for end in range(length - 2, n - 2, -1):  # `end` = index of the match's last token, before the tail's
            if tokens[end] == last and tokens[end - n + 1: end + 1] == tail:
                return end + 1, tokens[end + 1: end + 1 + k]
    return None


def all_continuations(tokens: list[int], k: int, max_n: int, min_n: int, limit: int) -> list[tuple[int, list[int]]]:
    """[(start, continuation)]: the up to k tokens after each of the `limit` most recent earlier occurrences
    of the longest suffix (max_n..min_n) that occurs earlier, distinct continuations only (a tree's branches)."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = tokens[length - n:]
        found, seen = [], set()
        for end in range(length - 2, n - 2, -1):
            if tokens[end] == tail[-1] and tokens[end - n + 1: end + 1] == tail:
                continuation = tuple(tokens[end + 1: end + 1 + k])
                if continuation not in seen:
                    seen.add(continuation)
                    found.append((end + 1, list(continuation)))
                    if len(found) == limit:
                        break
        if found:
            return found
    return []


class NgramDrafter:
    def __init__(self, spec: str = "ngram"):
        self.spec = spec
        self.max_n, self.min_n = parse_ngram_options(spec)
        self.lm = None  # no model: nothing to hook, no cache

    def new_state(self):
        return None

    def prefill(self, run, state, head: list[int]) -> None:
        pass

    def propose(self, run, state, tokens: list[int], k: int, keep_drafting=None) -> Proposal:
        """A lookup's proposal is certain (q one-hot, top probability 1): a p-min cut never stops it."""
        with run.timer.phase("draft"):
            found = lookup(tokens, k, self.max_n, self.min_n)
            ids = found[1] if found else []
            drafts = devices.upload(ids, run.device)
            q = torch.zeros(len(ids), run.vocab, device=run.device)
            q[torch.arange(len(ids), device=run.device), drafts] = 1.0  # one-hot: the proposal is certain
        source = (found[0], found[0] + len(ids)) if found else None
        return Proposal(drafts, q, source)

    def rollback(self, state, keep: int) -> None:
        pass
