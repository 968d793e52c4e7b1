"""`specview calibrate`: the cost curve of this machine (docs/design/whatif-and-calibrate.md "Cost curves").

Measures the target's forward time for 1 to 2K + 1 rows (K = max(-K, 8), so diagnosis' best K up to 2K and
whatif up to 16 are inside the measured range) at the prompt's position, and each drafter's time per
drafted token (its own propose(), sampling included: what a step pays per draft), then fits
metrics.CostCurve and keeps it in `<cache dir>/costs.json` keyed by host.cost_key (host, CPU and ISA
flags, torch, threads, target, compiled or not). diagnosis, report, bench and whatif use it from then on
for this machine; elsewhere they keep the one v measured at the run's K.

Prints a table and a plotext plot; writes the document and its plot (PNG, SVG) into --profile-dir.
"""

from __future__ import annotations

import time

import torch
from rich.table import Table
from rich.text import Text

from specview.core import host
from specview.core.files import save_figure
from specview.core.metrics import CostCurve, fit_cost_curve
from specview.engine import device as devices
from specview.engine.kv_cache import crop_cache, new_cache
from specview.session import Session

SCHEMA = "specview.calibrate/1"
MIN_K = 8  # rows measured: 1 .. 2 max(K, 8) + 1


def measure_target(session: Session, rows: list[int], repeats: int) -> dict[int, float]:
    """Target forward ms (lower quartile of the rounds) for each row count, at the prompt's position; rounds interleave the counts
    so a shared machine's drift hits them all alike."""
    dec = session.decoder("autoregressive")
    target = session.target
    cache = new_cache(target)
    prompt = session.prompt_ids
    dec.forward(target, cache, prompt, keep=1)
    base = cache.get_seq_length()
    feed = (prompt * (max(rows) // len(prompt) + 1))[: max(rows)]
    times: dict[int, list[float]] = {r: [] for r in rows}
    for rnd in range(repeats + 1):  # the first round warms every path up
        for r in rows:
            devices.synchronize(session.device)  # on a device: time the forward's work, not its launch
            t0 = time.perf_counter()
            dec.forward(target, cache, feed[:r], keep=r)
            devices.synchronize(session.device)
            ms = (time.perf_counter() - t0) * 1000
            crop_cache(cache, base)
            if rnd:
                times[r].append(ms)
    return {r: lower_quartile(t) for r, t in times.items()}


def lower_quartile(values: list[float]) -> float:
    """A machine shared with other work only ever adds time to a forward: the lower quartile of the rounds
    is steadier than their median there (measured: the median of 5 rounds jumped 40% between row counts)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]


def measure_drafter(session: Session, drafter, k: int, repeats: int) -> float | None:
    """Ms per drafted token (lower quartile) of one propose() of k tokens after the prompt (the prompt twice, so n-gram
    lookup finds a match); None when it proposes nothing."""
    dec = session.decoder(drafter=drafter)
    tokens = session.prompt_ids * 2
    state = drafter.new_state()
    drafter.prefill(dec, state, tokens[:-1])
    per_token = []
    for rnd in range(repeats + 1):
        if hasattr(drafter, "state_after_a_step"):  # a head fed the target's states (drafters/eagle3.py): as a step
            state = drafter.state_after_a_step(dec, tokens)  # leaves it, its catch-up rows to feed (untimed)
        dec.timer.start_step()
        devices.synchronize(session.device)
        t0 = time.perf_counter()
        proposal = drafter.propose(dec, state, tokens, k)
        devices.synchronize(session.device)
        ms = (time.perf_counter() - t0) * 1000
        dec.timer.end_step()
        drafter.rollback(state, len(tokens) - 1)
        if rnd and len(proposal):
            per_token.append(ms / len(proposal))
    return lower_quartile(per_token) if per_token else None


def calibrate(session: Session, max_rows: int, repeats: int, say=lambda msg: None) -> tuple[CostCurve, str]:
    """Measure, fit, keep in the cache -> (curve, its cache key)."""
    from specview.profiling.roofline import floor_ms, measure_bandwidth, model_bytes

    rows = list(range(1, max_rows + 1))
    say(f"timing the target's forward for 1..{max_rows} rows")
    target_ms = measure_target(session, rows, repeats)
    draft_ms = {}
    for d in session.drafters:
        say(f"timing {d.spec} per drafted token")
        ms = measure_drafter(session, d, min(session.settings.k, 8), repeats)
        if ms is not None:
            draft_ms[d.spec] = ms
    bw = measure_bandwidth(session.device)
    floor = floor_ms(model_bytes(session.target.model, session.target.forward.runner)["weights"], bw["gbs"])
    curve = fit_cost_curve(rows, [target_ms[r] for r in rows], draft_ms, floor)
    key = host.cost_key(session.settings.target, torch.get_num_threads(), torch.__version__,
                        (session.forwards.get(session.settings.target) or {}).get("mode"),
                        str(session.device), devices.name(session.device))
    cached = host.read_cached(host.COSTS_FILE)
    old = cached.get(key) if isinstance(cached.get(key), dict) else {}
    kept = CostCurve.from_json(old.get("curve") or {})
    if kept is not None:  # drafters measured before with another --draft list stay
        curve = CostCurve(curve.rows, curve.ms, curve.intercept_ms, curve.slope_ms,
                          {**kept.draft_ms, **curve.draft_ms}, curve.floor_ms, curve.rmse_ms)
    cached[key] = {"curve": curve.to_json(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "cpu": host.cpu_summary(), "position": len(session.prompt_ids), "repeats": repeats,
                   "bandwidth_gbs": bw["gbs"]}
    host.store_cached(host.COSTS_FILE, cached)
    return curve, key


def curve_table(curve: CostCurve) -> Table:
    t1 = curve.t_ar_ms
    table = Table(title="target forward by rows (verify of K drafts = K + 1 rows)", title_justify="left")
    for col in ("rows", "measured ms", "curve ms", "x one row"):
        table.add_column(col, justify="right")
    for r, ms in zip(curve.rows, curve.ms):
        table.add_row(str(r), f"{ms:.1f}", f"{curve.target_ms(r):.1f}", f"{curve.target_ms(r) / t1:.2f}")
    return table


def describe(curve: CostCurve) -> list[str]:
    lines = [f"fit over rows >= 2: {curve.intercept_ms:.1f} ms + {curve.slope_ms:.2f} ms x rows "
             f"(rmse {curve.rmse_ms:.2f} ms); one row {curve.t_ar_ms:.1f} ms as measured"]
    if curve.floor_ms:
        lines.append(f"of the fixed part, {curve.floor_ms:.1f} ms is reading the weights at the measured bandwidth "
                     f"(bytes / bandwidth); {curve.intercept_ms - curve.floor_ms:.1f} ms is above that floor")
    for spec, ms in curve.draft_ms.items():
        lines.append(f"drafter {spec}: {ms:.2f} ms per drafted token (c = {curve.c(spec):.3f})")
    return lines


def terminal_plot(curve: CostCurve, width: int = 90, height: int = 18, color: bool = True) -> Text:
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("pro" if color else "clear")
    plt.scatter(list(curve.rows), list(curve.ms), label="measured")
    plt.plot(list(curve.rows), [curve.target_ms(r) for r in curve.rows], label="curve")
    plt.title("target forward ms by rows fed")
    plt.xlabel("rows")
    out = plt.build()
    plt.clear_figure()
    return Text.from_ansi(out) if color else Text(plt.uncolorize(out))


def write_plot_files(curve: CostCurve, json_path: str, title: str) -> list[str]:
    """The curve as <stem>.png and <stem>.svg beside the JSON (matplotlib's Agg canvas, no display)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.plot(curve.rows, curve.ms, "o", label="measured (lower quartile of the rounds)")
    ax.plot(curve.rows, [curve.target_ms(r) for r in curve.rows], "-", label="curve: one row as measured, "
            f"{curve.intercept_ms:.1f} + {curve.slope_ms:.2f} x rows")
    if curve.floor_ms:
        ax.axhline(curve.floor_ms, color="0.4", linestyle="--", linewidth=0.8, label="weights / bandwidth")
    ax.set_xlabel("rows fed (a verify of K drafts: K + 1)")
    ax.set_ylabel("target forward ms")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, json_path)
