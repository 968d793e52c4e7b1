"""Where a token came from, as a colour: ONE palette for `specview run`'s stream, the TUI and the help.
Plain rich style strings (no textual), so headless and TUI output look alike."""

from __future__ import annotations

ORIGIN_STYLES = {
    "prompt": "dim",
    "accepted": "green",  # a draft token that passed the accept test
    "resampled": "bold red",  # drawn from the residual max(0, p - q) after a rejection
    "bonus": "bold blue",  # the target's own token after every draft was accepted
    "target": "",  # autoregressive decoding: every token is the target's
}
ACCEPT_STYLE, REJECT_STYLE = ORIGIN_STYLES["accepted"], ORIGIN_STYLES["resampled"]
LEGEND = ("accepted", "resampled", "bonus")


def legend_markup() -> str:
    """'[green]accepted[/] · [bold red]resampled[/] · [bold blue]bonus[/]' for rich markup."""
    return " · ".join(f"[{ORIGIN_STYLES[name]}]{name}[/]" for name in LEGEND)
