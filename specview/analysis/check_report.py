"""What `specview check` prints: each drafter's findings in words, and one closing line of key=value pairs
that a script can read (`result=pass|fail|inconclusive`, the greedy and distribution figures), and its exit code."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def _piece(tok, token_id: int) -> str:
    return repr(tok.decode([token_id])) if token_id >= 0 else "(the end)"


def _short(text: str, width: int = 40, end: bool = False) -> str:
    """`text` on one line, cut to `width` (keeping its end with `end`: where a prefix leads)."""
    text = text.replace("\n", "\\n")
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1):] if end else text[: width - 1] + "…"


def print_greedy(console: Console, result, texts: list[str], tok) -> None:
    console.print(Text(f"\n{result.spec}", style="bold"))
    ok = result.greedy_ok
    line = f"  greedy: {result.same}/{result.prompts} prompts give the autoregressive tokens"
    console.print(Text(line + ("" if ok else "  FAIL"), style=None if ok else "bold red"))
    for d in result.divergences:
        why = ("a near-tie of float arithmetic (the margin is within the logits' own float noise between a "
               "batched forward and one token at a time), not a bug" if d.near_tie else
               "a clear margin: not float noise, the engine emitted a token the target does not pick")
        console.print(f"    prompt {d.prompt + 1} ({_short(texts[d.prompt])!r}) differs at generated token "
                      f"{d.position}: autoregressive {d.autoregressive} {_piece(tok, d.autoregressive)}, speculative "
                      f"{d.speculative} {_piece(tok, d.speculative)}; the target's top-2 logit margin there is "
                      f"{d.margin:.2e} (float noise {d.noise:.2e}): {why}", soft_wrap=False)


def print_distribution(console: Console, result, prefix: list[int], tok, threshold: float, greedy: bool) -> None:
    if greedy:
        console.print("  distribution: not tested at temperature 0 (greedy is the whole law); give --temperature > 0")
        return
    where = _short(tok.decode(prefix), 60, end=True)
    if not result.tested:
        return
    if result.p_value is None:
        console.print(Text(f"  distribution at {where!r}: INCONCLUSIVE: {result.note.rstrip('; ')}", style="bold yellow"))
        return
    ok = result.p_value >= threshold
    verdict = ("consistent with the target's distribution" if ok else
               "the emitted tokens do NOT follow the target's distribution  FAIL")
    later = (f"; the {result.later_tokens} tokens the steps emitted after their first ({result.bonuses} steps ended in "
             f"a bonus), each against the target's law after the tokens before it, ranked: p-value "
             f"{result.later_p:.3g}" if result.later_p is not None else "")
    console.print(Text(f"  distribution of the first token after {where!r}: chi-square {result.statistic:.1f} over "
                       f"{result.bins} bins (the most likely tokens + a tail bin), p-value {result.first_p:.3g}{later}; "
                       f"together (Bonferroni) {result.p_value:.3g} {'>=' if ok else '<'} threshold {threshold:g}: "
                       f"{verdict}", style=None if ok else "bold red"), soft_wrap=True)  # one line: grep-able
    if ok and result.drafted == 0:
        console.print(Text("  INCONCLUSIVE: the drafter proposed nothing, so the draws measured the target alone",
                           style="bold yellow"))
    if result.note:
        console.print(f"  note: {result.note.rstrip('; ')}", style="dim")


# `specview check`'s exit codes: 2 is bad input and 130 an interruption, as for every command.
EXIT = {"pass": 0, "fail": 1, "inconclusive": 3}


def passed(results, threshold: float) -> bool:
    """Nothing failed (an inconclusive distribution test did not fail)."""
    return all(r.greedy_ok and (r.p_value is None or r.p_value >= threshold) for r in results)


def verdict(results, threshold: float, greedy: bool) -> str:
    """fail: a test failed; inconclusive: none failed, but a distribution test could not tell (no power, or the
    drafter proposed nothing); pass: every test ran and passed."""
    if not passed(results, threshold):
        return "fail"
    if not greedy and any(getattr(r, "inconclusive", False) for r in results):
        return "inconclusive"
    return "pass"


def summary_line(results, threshold: float, greedy: bool) -> str:
    prompts = sum(r.prompts for r in results)
    same = sum(r.same for r in results)
    ties = sum(d.near_tie for r in results for d in r.divergences)
    values = [r.p_value for r in results if r.p_value is not None]
    dist = "skipped" if greedy else (f"{min(values):.4g}" if values else "inconclusive")
    return (f"result={verdict(results, threshold, greedy)} drafters={len(results)} "
            f"greedy_same={same}/{prompts} near_ties={ties} distribution_p={dist} threshold={threshold:g}")
