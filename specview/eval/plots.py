"""An eval's three plots, in the terminal (plotext) and as PNG and SVG files beside its JSON (matplotlib,
Agg: no display needed): acceptance by category per drafter, the accepted-length histogram, and the
speedup over autoregressive by category. Both read the document's summary only, so `report` could draw them
from a file too."""

from __future__ import annotations

from rich.text import Text

from specview.core.files import save_figure
from specview.core.metrics import ratio
from specview.eval.summary import AUTOREGRESSIVE

MARKERS = ["█", "▒", "░", "▓", "#", "+", "o", "x"]  # series without colour (a pipe, a log file)


def plot_data(doc: dict) -> dict:
    """What the plots show, from the summary: categories (+ "all"), and per drafter the acceptance rate and
    speedup (mean of prompts) per category, and the share of drafting steps per accepted length 0..K."""
    summary = doc.get("summary") or {}
    drafters = [d for d in summary if d != AUTOREGRESSIVE]
    categories: list[str] = []
    for d in drafters:
        categories += [c for c in summary[d].get("by_category") or {} if c not in categories]
    labels = categories + ["all"]

    def per_category(d: str, key: str) -> list[float]:
        s = summary[d]
        rows = [(s.get("by_category") or {}).get(c) or {} for c in categories] + [s.get("overall") or {}]
        return [row.get(key) or 0.0 for row in rows]  # a missing figure draws as no bar

    def lengths(d: str) -> list[float]:
        hist = (summary[d].get("overall") or {}).get("accepted_length_histogram") or []
        return [ratio(n, sum(hist)) or 0.0 for n in hist]

    k = (doc.get("config") or {}).get("k") or 0
    return {"drafters": drafters, "categories": labels, "k": k,
            "acceptance": {d: per_category(d, "acceptance_rate") for d in drafters},
            "speedup": {d: per_category(d, "speedup_mean_of_prompts") for d in drafters},
            "lengths": {d: (lengths(d) + [0.0] * (k + 1))[: k + 1] for d in drafters}}


def terminal_plots(doc: dict, color: bool = True, width: int = 100, height: int = 16) -> list[Text]:
    import plotext as plt

    data = plot_data(doc)
    if not data["drafters"]:
        return []
    names = data["drafters"]
    charts = [
        ("acceptance rate by category (accepted drafts / drafted)", data["categories"],
         [data["acceptance"][d] for d in names], None),
        (f"accepted length per drafting step (share of steps; K = {data['k']})",
         [str(n) for n in range(data["k"] + 1)], [data["lengths"][d] for d in names], None),
        ("speedup over autoregressive by category (mean of per-prompt speedups)", data["categories"],
         [data["speedup"][d] for d in names], 1.0),
    ]
    out = []
    for title, x, ys, line in charts:
        plt.clear_figure()
        plt.plotsize(width, height)
        plt.theme("pro" if color else "clear")
        # Without colours the series differ by their fill character.
        plt.multiple_bar(x, ys, labels=names, marker=None if color else MARKERS[: len(ys)])
        if line is not None:
            plt.hline(line)
        plt.title(title)
        out.append(Text.from_ansi(plt.build()) if color else Text(plt.uncolorize(plt.build())))
    plt.clear_figure()
    return out


def write_plot_files(doc: dict, json_path: str) -> list[str]:
    """The same three plots side by side in one figure: <stem>.png and <stem>.svg beside the JSON."""
    from matplotlib.figure import Figure  # the Agg canvas, no pyplot state and no display

    data = plot_data(doc)
    c = doc.get("config") or {}
    fig = Figure(figsize=(16, 4.6), layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[2.2, 1.2, 2.2])
    names = data["drafters"]
    _bars(axes[0], data["categories"], [data["acceptance"][d] for d in names], names)
    axes[0].set_title("acceptance rate (accepted / drafted)")
    axes[0].set_ylim(0, 1)
    _bars(axes[1], [str(n) for n in range(data["k"] + 1)], [data["lengths"][d] for d in names], names)
    axes[1].set_title("accepted drafts per step (share)")
    axes[1].set_xlabel("accepted length")
    _bars(axes[2], data["categories"], [data["speedup"][d] for d in names], names)
    axes[2].axhline(1.0, color="0.3", linewidth=0.8, linestyle="--")
    axes[2].set_title("speedup over autoregressive (mean of prompts)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=max(len(names), 1), fontsize=9, frameon=False)
    temperature = c.get("temperature")
    fig.suptitle(f"specview eval · target {c.get('target')} · N {c.get('max_new_tokens')} · K {c.get('k')} · "
                 f"temperature {temperature}{' (greedy)' if temperature == 0 else ''} · "
                 f"{len({r['prompt_id'] for r in doc.get('results') or []})} prompts", fontsize=11)
    return save_figure(fig, json_path)


def _bars(ax, labels: list[str], series: list[list[float]], names: list[str]) -> None:
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (values, name) in enumerate(zip(series, names)):
        ax.bar([x + (i - (n - 1) / 2) * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=20 if len(labels) > 4 else 0, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
