"""Token text decoded in context: ONE home for the engine's emitted tokens and the other ids a viewer draws
(the TUI, the serve stream).

A token's text depends on what precedes it (a leading space, a multi-byte character split over
tokens), so decode a few tokens of context with and without it and keep the difference; a piece of
an unfinished UTF-8 character shows as U+FFFD.
"""

from __future__ import annotations

CONTEXT = 6  # tokens of context: enough for any byte-level merge seen in practice


def piece_in_context(decode, before: list[int], token: int, context: int = CONTEXT) -> str:
    prefix = list(before[-context:]) if context else []
    return decode(prefix + [token])[len(decode(prefix)):]


def token_texts(decode, before: list[int], step) -> dict[int, str]:
    """Text of each id a StepResult mentions, decoded after the tokens it follows (piece_in_context:
    leading spaces and multi-byte pieces come out as in the output)."""
    ctx = list(before[-CONTEXT:])
    out: dict[int, str] = {}

    def piece(prefix: list[int], tok: int) -> str:
        return piece_in_context(decode, prefix, tok, context=0)

    for i, tok in enumerate(step.drafted):
        out.setdefault(tok, piece(ctx + step.drafted[:i], tok))
    at = ctx + step.drafted[: step.accepted]
    others = [step.resampled, step.bonus] + [int(t) for t, _ in step.residual_top or []]
    for tok in others:
        if tok is not None and tok not in out:
            out[tok] = piece(at, tok)
    for tok, text in zip(step.emitted, step.tokens):
        out.setdefault(tok, text)
    tree = getattr(step, "tree", None)
    for j, tok in enumerate(tree["tokens"] if tree else []):  # a tree's other nodes, after their ancestors
        if tok not in out:
            ancestors, node = [], tree["parents"][j]
            while node >= 0:
                ancestors.append(tree["tokens"][node])
                node = tree["parents"][node]
            out[tok] = piece(ctx + ancestors[::-1], tok)
    return out
