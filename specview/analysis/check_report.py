"""What `specview check` prints: each drafter's findings in words, and one closing line of key=value pairs
that a script can read (`result=pass|fail`, the greedy and distribution figures)."""

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
    if result.p_value is None:
        console.print(f"  distribution at {where!r}: inconclusive: {result.note}")
        return
    ok = result.p_value >= threshold
    verdict = ("consistent with the target's distribution" if ok else
               "the first token does NOT follow the target's distribution  FAIL")
    console.print(Text(f"  distribution of the first token after {where!r}: chi-square {result.statistic:.1f} over "
                       f"{result.bins} bins (the most likely tokens + a tail bin), p-value {result.p_value:.3g} "
                       f"{'>=' if ok else '<'} threshold {threshold:g}: {verdict}", style=None if ok else "bold red"))
    if result.note:
        console.print(f"  note: {result.note.rstrip('; ')}", style="dim")


def passed(results, threshold: float) -> bool:
    return all(r.greedy_ok and (r.p_value is None or r.p_value >= threshold) for r in results)


def summary_line(results, threshold: float, greedy: bool) -> str:
    prompts = sum(r.prompts for r in results)
    same = sum(r.same for r in results)
    ties = sum(d.near_tie for r in results for d in r.divergences)
    values = [r.p_value for r in results if r.p_value is not None]
    dist = "skipped" if greedy else (f"{min(values):.4g}" if values else "inconclusive")
    return (f"result={'pass' if passed(results, threshold) else 'fail'} drafters={len(results)} "
            f"greedy_same={same}/{prompts} near_ties={ties} distribution_p={dist} threshold={threshold:g}")
