"""The table of a --profile-ops capture (torch.profiler's top operators): no torch here, so `specview report` of a
profile stays instant."""

from __future__ import annotations

from rich.table import Table

from specview.core.events import fmt


def ops_table(ops: dict, limit: int = 15) -> Table:
    """Top operators of a --profile-ops capture: self time and share of draft and verify."""
    clock = ops.get("clock", "cpu")
    table = Table(title=f"top operators by self {clock} time (torch.profiler; aten:: omitted)", title_justify="left",
                  caption=f"share of draft / verify = the operator's self time in that phase / the phase's time; "
                          f"trace: {ops.get('trace', '')}", caption_justify="left")
    table.add_column("operator", overflow="fold", min_width=20)
    for col in ("calls", "self ms", "% of ops", "% draft", "% verify"):
        table.add_column(col, justify="right")
    for op in (ops.get("top") or [])[:limit]:
        table.add_row(str(op.get("name")).removeprefix("aten::"), str(op.get("calls")), fmt(op.get("self_ms"), "{:.1f}"),
                      fmt(op.get("share"), "{:.1%}"), fmt(op.get("draft_share"), "{:.1%}", ""),
                      fmt(op.get("verify_share"), "{:.1%}", ""))
    return table
