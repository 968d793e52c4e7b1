"""Does watching change what is measured? The TUI against a headless `specview run`, same settings, in one
sitting (docs/design.md, "Engine stream"):

    python -m specview.tui.fidelity [--rounds 2] [run options, e.g. --threads 1]      (make fidelity)

Each round runs `specview run --profile` and then the TUI (headless, through Pilot, with its engine in a
child process as always: `r` until the run ends, then `q`), and reads both profiles. Per round and
over all rounds it prints the median verify forward per step, the median draft forward per drafted
token and tokens/s, headless against TUI. The figures are the profiles' own: the same step records.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

from rich.console import Console
from rich.table import Table


def medians(profile: dict) -> dict:
    steps = [s for s in profile["steps"] if s.get("drafted")]
    verify = [s["phases_ms"]["verify"] for s in steps]
    draft = [s["phases_ms"]["draft"] / len(s["drafted"]) for s in steps]
    walls = [sum(s["phases_ms"][k] for k in ("draft", "verify", "sample", "cache", "other")) for s in profile["steps"]]
    return {"verify_ms": statistics.median(verify) if verify else None,
            "step_ms": statistics.median(walls) if walls else None,
            "prefill_ms": round(profile["summary"].get("prefill_ms") or 0.0, 1),
            "draft_ms_per_token": statistics.median(draft) if draft else None,
            "tokens_per_s": profile["summary"]["tokens_per_s"], "steps": profile["summary"]["steps"]}


def newest(folder: str) -> dict:
    paths = [p for p in glob.glob(os.path.join(folder, "*.json")) if os.path.basename(p).count(".") == 1]
    with open(max(paths, key=os.path.getmtime)) as f:
        return json.load(f)


def headless(run_args: list[str], folder: str) -> dict:
    subprocess.run([sys.executable, "-m", "specview.cli", "run", *run_args, "--quiet", "--profile-dir", folder],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return medians(newest(folder))


def tui(run_args: list[str], folder: str) -> dict:
    from specview.options import build_tui_parser
    from specview.settings import Settings
    from specview.tui.app import SpecviewApp
    from specview.tui.process import ProcessBackend
    from specview.tui.state import AppState

    settings = Settings.from_args(build_tui_parser().parse_args([*run_args, "--profile-dir", folder]))

    async def drive() -> None:
        app = SpecviewApp(ProcessBackend(settings))
        async with app.run_test(size=(120, 40)) as pilot:
            while not app.loaded:
                await pilot.pause(0.2)
            await pilot.press("r")
            while app.state is not AppState.ENDED:
                await pilot.pause(0.2)
            await pilot.press("q")
            while app.profile_path is None:
                await pilot.pause(0.2)

    asyncio.run(drive())
    return medians(newest(folder))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specview.tui.fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="headless + TUI pairs (default 2)")
    args, run_args = p.parse_known_args(argv)
    console = Console(width=max(Console().width, 150))
    table = Table(title="headless `specview run` against the TUI (medians per step)", title_justify="left")
    for col in ("round", "verify ms run", "verify ms TUI", "TUI/run", "draft ms/token run", "draft ms/token TUI",
                "TUI/run", "tokens/s run", "tokens/s TUI", "TUI/run"):
        table.add_column(col, justify="right")
    pairs = []
    with tempfile.TemporaryDirectory(prefix="specview-fidelity-") as tmp:
        for r in range(args.rounds):
            a = headless(run_args, os.path.join(tmp, f"run{r}"))
            b = tui(run_args, os.path.join(tmp, f"tui{r}"))
            pairs.append((a, b))
            table.add_row(str(r + 1), *_cells(a, b))
            console.print(f"round {r + 1}: run {a['steps']} steps, TUI {b['steps']} steps; median step "
                          f"{a['step_ms']:.1f} / {b['step_ms']:.1f} ms; prefill {a['prefill_ms']} / {b['prefill_ms']} ms",
                          style="dim")
    if len(pairs) > 1:
        pooled = [{k: statistics.median(x[k] for x in side) for k in ("verify_ms", "draft_ms_per_token", "tokens_per_s")}
                  for side in zip(*pairs)]
        table.add_row("median", *_cells(*pooled), style="bold")
    console.print(table)
    return 0


def _cells(a: dict, b: dict) -> list[str]:
    out = []
    for key in ("verify_ms", "draft_ms_per_token", "tokens_per_s"):
        x, y = a[key], b[key]
        out += [f"{x:.2f}", f"{y:.2f}", f"{y / x:.3f}" if x and y else "n/a"]
    return out


if __name__ == "__main__":
    sys.exit(main())
