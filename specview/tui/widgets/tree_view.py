"""A token tree's step drawn as a tree (docs/design/trees.md): one node per line under box-drawing branches,
each with its token, q(x), p(x) and verdict; the accepted path bright, the rejected siblings red, the nodes
never tried dim, and the resampled or bonus token where the path ends. The branches off the path are
folded into a count, and the lines past what fits into one "… N more" line."""

from __future__ import annotations

from rich.text import Text

from specview.backend.views import StepView
from specview.core.palette import ACCEPT_STYLE, ORIGIN_STYLES, REJECT_STYLE
from specview.tui.render import visible

TOKEN = 10  # token text cells


def _children(parents: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for j, parent in enumerate(parents):
        out.setdefault(parent, []).append(j)
    return out


def _below(kids: dict[int, list[int]], node: int) -> int:
    return sum(1 + _below(kids, child) for child in kids.get(node, []))


def _prob(x: float) -> str:
    """Four cells: 0.23, 4e-3, 0 (below 1e-9 too)."""
    if x >= 0.00995:
        return f"{x:.2f}"
    if x < 1e-9:
        return "0   "
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def tree_text(view: StepView, greedy: bool, width: int, max_lines: int) -> Text:
    """The tree of `view`'s step in at most `max_lines` lines of at most `width` cells."""
    s, texts = view.step, view.texts
    tree = s.tree
    parents, tokens, q, p = tree["parents"], tree["tokens"], tree["q"], tree["p"]
    path, rejected = set(tree["path"]), set(tree.get("rejected") or [])
    kids = _children(parents)
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    deepest = max(depth, default=1)
    lines: list[tuple[Text, bool]] = [(Text(f"root · {len(tokens)} nodes, {len(path)} accepted", style="dim"), True)]

    def node_line(prefix: str, branch: str, j: int) -> Text:
        if j in path:
            mark, style = "✓", ACCEPT_STYLE
        elif j in rejected:
            mark, style = "✗", REJECT_STYLE
        else:
            mark, style = "·", "dim"
        line = Text(prefix + branch, style="dim")
        pad = 3 * (deepest - depth[j])  # q and p in one column at every depth
        line.append(f"{mark} {visible(texts.get(tokens[j], '?'), TOKEN):<{TOKEN + pad}}", style=style)
        line.append(f" q {_prob(q[j])} p {_prob(p[j])}", style="" if j in path or j in rejected else "dim")
        folded = _below(kids, j) if j not in path else 0
        if folded:
            line.append(f" +{folded}", style="dim")
        return line

    end = tree["path"][-1] if tree["path"] else -1
    extra = s.resampled if s.rejected_at is not None else s.bonus

    def walk(node: int, prefix: str) -> None:
        children = kids.get(node, [])
        ends_here = node == end and extra is not None  # the resampled or bonus token comes last, under it
        for i, child in enumerate(children):
            last = i == len(children) - 1 and not ends_here
            lines.append((node_line(prefix, "└─" if last else "├─", child), child in path))
            if child in path:
                walk(child, prefix + ("   " if last else "│  "))
        if ends_here:
            origin = "resampled" if s.rejected_at is not None else "bonus"
            line = Text(prefix + "└▶", style="dim")
            line.append(f"  {visible(texts.get(extra, '?'), TOKEN):<{TOKEN}}", style=ORIGIN_STYLES[origin])
            line.append(f" {origin}", style="dim")
            lines.append((line, True))

    walk(-1, "")
    if len(lines) > max_lines:  # keep the path and what ends it, then the others in order, then a count
        room = max_lines - 1 - sum(keep for _, keep in lines)
        kept = []
        for line, keep in lines:
            if keep or room > 0:
                room -= not keep
                kept.append((line, keep))
        hidden = len(lines) - len(kept)
        lines = kept + [(Text(f"… {hidden} more", style="dim"), True)]
    out = Text()
    for i, (line, _) in enumerate(lines):
        line.truncate(width, overflow="ellipsis")
        out.append_text(line)
        if i < len(lines) - 1:
            out.append("\n")
    return out
