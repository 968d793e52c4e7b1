"""Does watching change what is measured? The TUI against a headless `specview run`, same settings, in one
sitting (docs/design/tui.md, "The engine stream"):

    python -m specview.tools.tui_fidelity [--rounds 3] [--terminal both|pilot|tmux] [run options, e.g. --threads 1]
                                                                                          (make fidelity)

A sitting starts with `specview run --profile`; each round then runs the TUI through Pilot (headless: it
paints nothing) and the TUI in a real pseudo-terminal (a detached tmux pane of 120x40: the screen is drawn,
escape codes and all, and tmux parses them as a terminal would), each with its engine in a child process as
always: `r` until the run ends, then `q`, each followed by another `specview run --profile`: every TUI run is
held against the mean of the headless runs on either side of it (a drifting host moves both alike). It reads
the profiles and prints, per round and over all rounds, the median verify forward per step, the median draft
forward per drafted token and tokens/s, each TUI against its headless runs, with the TUI's own CPU per step (its
timing panel's `ui … ms cpu/step`, read off the screen in tmux) and the load average. The figures are the profiles'
own: the same step records.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

SIZE = (120, 40)  # the terminal the TUI runs in, both ways
POLL_S = 1.0  # how often the tmux screen is read while the TUI runs (a capture costs a few ms of CPU)
TIMEOUT_S = 600.0  # loading and a run, at most
UI_CPU = re.compile(r"ui (\d+(?:\.\d+)?) ms cpu/step")


def medians(profile: dict) -> dict:
    steps = [s for s in profile["steps"] if s.get("drafted")]
    verify = [s["phases_ms"]["verify"] for s in steps]
    draft = [s["phases_ms"]["draft"] / len(s["drafted"]) for s in steps]
    walls = [sum(s["phases_ms"][k] for k in ("draft", "verify", "sample", "cache", "other")) for s in profile["steps"]]
    return {"verify_ms": statistics.median(verify) if verify else None,
            "step_ms": statistics.median(walls) if walls else None,
            "prefill_ms": round(profile["summary"].get("prefill_ms") or 0.0, 1),
            "draft_ms_per_token": statistics.median(draft) if draft else None,
            "tokens_per_s": profile["summary"]["tokens_per_s"], "steps": profile["summary"]["steps"],
            "ui_cpu_ms": None, "load": os.getloadavg()[0]}


def newest(folder: str) -> dict:
    paths = [p for p in glob.glob(os.path.join(folder, "*.json")) if os.path.basename(p).count(".") == 1]
    with open(max(paths, key=os.path.getmtime)) as f:
        return json.load(f)


def headless(run_args: list[str], folder: str) -> dict:
    subprocess.run([sys.executable, "-m", "specview.cli.main", "run", *run_args, "--quiet", "--profile-dir", folder],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return medians(newest(folder))


def pilot(run_args: list[str], folder: str) -> dict:
    """The TUI under Pilot: the app runs, its widgets render, but no terminal receives a frame."""
    from specview.core.options import build_tui_parser
    from specview.core.settings import Settings
    from specview.tui.app import SpecviewApp
    from specview.tui.process import ProcessBackend
    from specview.tui.state import AppState

    settings = Settings.from_args(build_tui_parser().parse_args([*run_args, "--profile-dir", folder]))
    ui_cpu = []

    async def drive() -> None:
        app = SpecviewApp(ProcessBackend(settings))
        async with app.run_test(size=SIZE) as pilot:
            while not app.loaded:
                await pilot.pause(0.2)
            await pilot.press("r")
            while app.state is not AppState.ENDED:
                await pilot.pause(0.2)
            ui_cpu.append(app.stats.ui_cpu_per_step)
            await pilot.press("q")
            while app.profile_path is None:
                await pilot.pause(0.2)

    asyncio.run(drive())
    return {**medians(newest(folder)), "ui_cpu_ms": ui_cpu[0]}


class Tmux:
    """One detached tmux session on a server of its own (`-L`): other tmux sessions are never touched."""

    def __init__(self, command: list[str], size: tuple[int, int] = SIZE):
        self.socket = f"specview-fidelity-{os.getpid()}"
        width, height = size
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", "tui", "-x", str(width), "-y", str(height),
                   "-c", os.getcwd(), "exec " + shlex.join(command))

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True).stdout

    @property
    def alive(self) -> bool:
        return subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", "tui"],
                              capture_output=True).returncode == 0

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "tui")

    def press(self, key: str) -> None:
        self._tmux("send-keys", "-t", "tui", key)

    def wait_for(self, pattern: str, timeout: float = TIMEOUT_S) -> str:
        """The screen once its status line (the first line) shows `pattern`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"the TUI ended before showing {pattern!r}")
            screen = self.screen()
            if pattern in screen.partition("\n")[0]:
                return screen
            time.sleep(POLL_S)
        raise TimeoutError(f"the TUI did not show {pattern!r} in {timeout:.0f} s:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def terminal(run_args: list[str], folder: str) -> dict:
    """The TUI in a real pseudo-terminal (tmux): every frame is drawn and parsed, as on a person's screen."""
    app = Tmux([sys.executable, "-m", "specview.cli.main", *run_args, "--profile-dir", folder])
    try:
        app.wait_for("paused")  # loaded
        app.press("r")
        screen = app.wait_for("ended")
        found = UI_CPU.search(screen)
        app.press("q")
        deadline = time.monotonic() + TIMEOUT_S
        while app.alive and time.monotonic() < deadline:  # the profile is saved, then the TUI exits
            time.sleep(0.2)
    finally:
        app.close()
    return {**medians(newest(folder)), "ui_cpu_ms": float(found.group(1)) if found else None}


def replayed(recording: str, pace: float) -> float | None:
    """The TUI's own CPU per step in tmux over a recorded run (tui/replay.py) replayed at `pace` seconds a
    step, no engine: what drawing costs when every step is drawn (steps of 0.25 s or more)."""
    app = Tmux([sys.executable, "-m", "specview.tools.tui_fidelity", "--play", recording, "--pace", str(pace)])
    try:
        app.wait_for("paused")
        app.press("r")
        found = UI_CPU.search(app.wait_for("ended"))
        app.press("q")
        deadline = time.monotonic() + TIMEOUT_S
        while app.alive and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        app.close()
    return float(found.group(1)) if found else None


def play(recording: str, pace: float) -> int:
    """The app in this terminal on a recording, a step every `pace` seconds (what `replayed` watches)."""
    from specview.tui.app import SpecviewApp
    from specview.tui.replay import ReplayBackend

    class Paced(ReplayBackend):
        def step(self):
            time.sleep(pace)  # the engine's step, without its CPU
            return super().step()

    with open(recording) as f:
        SpecviewApp(Paced(json.load(f))).run()
    return 0


def cpu_flags() -> str:
    """The vector extensions of this CPU that the forwards use (AVX2, AVX-512), for the record."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return ", ".join(name for name, flag in (("AVX2", "avx2"), ("AVX-512", "avx512f")) if flag in flags) or "no AVX2"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specview.tools.tui_fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="headless + TUI sets (default 3)")
    p.add_argument("--terminal", choices=("both", "pilot", "tmux"), default="both",
                   help="how the TUI runs: under Pilot (no screen), in a tmux pane (a real terminal), or both "
                        "(the default; Pilot only when tmux is missing)")
    p.add_argument("--keep", metavar="DIR", help="keep the profiles in DIR (default: a temporary folder)")
    p.add_argument("--replay", metavar="FILE", help="instead: the TUI's ui cpu/step in tmux over a recording "
                   "(e.g. tests/tui_recording.json) replayed a step every --pace seconds, each step drawn")
    p.add_argument("--pace", type=float, default=0.25, help="seconds a replayed step takes (default 0.25)")
    p.add_argument("--play", metavar="FILE", help=argparse.SUPPRESS)  # (the app --replay runs in tmux)
    args, run_args = p.parse_known_args(argv)
    if args.play:
        return play(args.play, args.pace)
    if args.replay:
        if shutil.which("tmux") is None:
            p.error("--replay needs tmux (apt-get install tmux)")
        for r in range(args.rounds):
            ui = replayed(args.replay, args.pace)
            print(f"round {r + 1}: ui {_ms(ui)} ms cpu/step over {args.replay} at {args.pace} s a step, "
                  f"load {os.getloadavg()[0]:.2f}")
        return 0
    modes = {"pilot": ["pilot"], "tmux": ["tmux"], "both": ["pilot", "tmux"]}[args.terminal]
    console = Console(width=max(Console().width, 150))
    if "tmux" in modes and shutil.which("tmux") is None:
        if args.terminal == "tmux":
            p.error("tmux is not installed (apt-get install tmux)")
        console.print("tmux is not installed: the TUI under Pilot only (apt-get install tmux for a real terminal)",
                      style="yellow")
        modes = ["pilot"]
    drivers = {"pilot": pilot, "tmux": terminal}
    console.print(f"CPU: {cpu_flags()}, {os.cpu_count()} cores; run options: {shlex.join(run_args) or '(defaults)'}; "
                  f"TUI at {SIZE[0]}x{SIZE[1]}", style="dim")
    rounds: dict[str, list] = {mode: [] for mode in modes}  # per mode, per round: {"run": its bracket, mode: medians}
    with tempfile.TemporaryDirectory(prefix="specview-fidelity-") as scratch:
        tmp = args.keep or scratch
        runs = [headless(run_args, os.path.join(tmp, "run0"))]
        for r in range(args.rounds):
            said = []
            for mode in modes:  # H pilot H tmux H ...: every TUI run between two headless runs of its own
                tui = drivers[mode](run_args, os.path.join(tmp, f"{mode}{r}"))
                runs.append(headless(run_args, os.path.join(tmp, f"run{len(runs)}")))
                rounds[mode].append({"run": bracket(runs[-2], runs[-1]), mode: tui})
                said += [(mode, tui), ("run", runs[-1])]
            console.print(f"round {r + 1}: " + "; ".join(
                f"{side} {m['steps']} steps, median step {m['step_ms']:.1f} ms, prefill {m['prefill_ms']} ms, "
                f"load {m['load']:.2f}" for side, m in said), style="dim")
    for mode in modes:
        console.print(_table(mode, rounds[mode]))
    note = noise_note(runs)
    if note:
        console.print(note, style="yellow" if "too noisy" in note else "dim")
    return 0


BAR = 1.05  # docs: TUI / headless within 5% for the verify and the draft per token


def bracket(before: dict, after: dict) -> dict:
    """The headless figures a TUI run is held against: the mean of the headless runs just before and just after
    it. A host whose speed drifts over minutes (a shared VM's neighbours) moves both sides of a pair alike only
    if they are measured around the same moment; bracketing cancels a steady drift, which a headless run before
    the TUI alone takes for the TUI's cost."""
    out = dict(before)
    for key, a in before.items():
        b = after.get(key)
        if key == "steps":
            continue
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out[key] = (a + b) / 2
        elif a is None:  # measured on one side only (a run without drafts): that side's figure
            out[key] = b
    return out


def noise_note(runs: list[dict]) -> str | None:
    """How far the headless runs themselves moved during the sitting: a TUI/headless ratio can only be judged
    against a bar wider than that (on a shared VM the same headless run can move by a third minutes apart)."""
    spreads = {}
    for key, name in (("verify_ms", "verify"), ("draft_ms_per_token", "draft per token")):
        values = [run[key] for run in runs if run[key]]
        if len(values) > 1:
            spreads[name] = max(values) / min(values)
    if not spreads:
        return None
    said = ", ".join(f"{name} {spread:.2f}x" for name, spread in spreads.items())
    line = f"headless runs from their quickest round to their slowest: {said}"
    if max(spreads.values()) > BAR:
        return f"{line}: this host is too noisy for the {BAR:.2f}x bar; judge the ratios on a quieter machine"
    return line


KEYS = ("verify_ms", "draft_ms_per_token", "tokens_per_s")


def _table(mode: str, rounds: list[dict]) -> Table:
    where = "under Pilot (no screen)" if mode == "pilot" else "in tmux (a real terminal)"
    table = Table(title=f"headless `specview run` against the TUI {where}: medians per step", title_justify="left")
    for col in ("round", "verify ms run", "verify ms TUI", "TUI/run", "draft ms/token run", "draft ms/token TUI",
                "TUI/run", "tokens/s run", "tokens/s TUI", "TUI/run", "ui ms cpu/step", "load"):
        table.add_column(col, justify="right")
    for r, found in enumerate(rounds):
        a, b = found["run"], found[mode]
        table.add_row(str(r + 1), *_cells(a, b), _ms(b["ui_cpu_ms"]), f"{b['load']:.2f}")
    if len(rounds) > 1:
        pooled = [{k: _median([f[side][k] for f in rounds]) for k in KEYS} for side in ("run", mode)]
        ratios = {k: _median([f[mode][k] / f["run"][k] for f in rounds if f[mode][k] and f["run"][k]]) for k in KEYS}
        ui = [f[mode]["ui_cpu_ms"] for f in rounds if f[mode]["ui_cpu_ms"] is not None]
        cells = _cells(*pooled)
        for i, k in enumerate(KEYS):  # the median of the rounds' ratios, not the ratio of the medians
            cells[3 * i + 2] = _ms(ratios[k], "{:.3f}")
        table.add_row("median", *cells, _ms(_median(ui)),
                      f"{statistics.median(f[mode]['load'] for f in rounds):.2f}", style="bold")
    return table


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ms(value: float | None, form: str = "{:.1f}") -> str:
    return "n/a" if value is None else form.format(value)


def _cells(a: dict, b: dict) -> list[str]:
    out = []
    for key in KEYS:
        x, y = a[key], b[key]
        out += [_ms(x, "{:.2f}"), _ms(y, "{:.2f}"), f"{y / x:.3f}" if x and y else "n/a"]
    return out


if __name__ == "__main__":
    sys.exit(main())
