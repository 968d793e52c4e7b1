"""The engine behind a stream: commands in, records out, one JSON object per line (docs/design/tui.md,
"The engine stream"). The TUI runs it as a child process so that nothing it draws can slow the engine down: in one
process, Textual's rendering holds the GIL between the forward's small operators (a verify forward timed
markedly slower under the TUI than in `specview run`). The step records are the `specview.events/1` step
records of `--jsonl`, plus what a viewer needs to draw them.

    python -m specview.backend.engine_stream SETTINGS_JSON        # Settings as JSON (settings.py)

commands (stdin)                      records (stdout)
  {"cmd": "load"}                       {"type": "progress", "text": ..} ..., then {"type": "loaded", "info": {..}, "run": 0}
  {"cmd": "step", "k": 4}               {"type": "step", <specview.events/1 step record>, "texts": {id: text}, "prefill_ms": ..}
  {"cmd": "new_run", "k": 4}            {"type": "run", "run": 1}
  {"cmd": "next_drafter"}               {"type": "drafter", "spec": ..}
  {"cmd": "save", "final": false}       {"type": "saved", "path": ..}
  {"cmd": "whatif"}                     {"type": "whatif", "figures": {specview.whatif/1} | null}  (docs/design/whatif-and-calibrate.md)
  {"cmd": "quit"}                       (saves like final, then exits 0)
  any failure                           {"type": "error", "message": "one line", "fatal": bool}
  (a line that is not such a command: not JSON, not an object, an unknown cmd, a k that is not an integer,
   a step before load or after the run ended: an error record, and the stream goes on)

End of input (the viewer is gone, however it died) saves the profile and exits: every exit path keeps it.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import asdict

from specview.backend.in_process import EngineBackend
from specview.backend.views import step_record
from specview.core.errors import SpecviewError, quoted
from specview.core.settings import Settings

COMMANDS = ("load", "step", "new_run", "next_drafter", "save", "quit", "whatif")


class Service:
    def __init__(self, settings: Settings, out=sys.stdout):
        self.backend = EngineBackend(settings)
        self.out = out
        self.loaded = False

    def send(self, record: dict) -> None:
        self.out.write(json.dumps(record, allow_nan=False) + "\n")
        self.out.flush()

    def handle(self, command) -> bool:
        """Run one command, answer it; False once the stream should end."""
        if not isinstance(command, dict):
            raise SpecviewError('a command is a JSON object, e.g. {"cmd": "step"}')
        name = command.get("cmd")
        if name not in COMMANDS:
            raise SpecviewError(f"unknown command {quoted(str(name))}")
        if not self.loaded and name in ("step", "new_run", "next_drafter", "whatif"):
            raise SpecviewError(f"{name} before load")
        if self.loaded and name == "load":
            raise SpecviewError("already loaded")
        if "k" in command:
            k = command["k"]
            if isinstance(k, bool) or not isinstance(k, int):
                raise SpecviewError(f"k must be an integer, got {quoted(json.dumps(k))}")
            self.backend.set_k(k)  # clamped to 1..K_MAX
        if name == "step" and self.backend.done:
            raise SpecviewError("the run is over: new_run first")
        if name == "load":
            info, run = self.backend.load(lambda text: self.send({"type": "progress", "text": text}))
            self.loaded = True
            self.send({"type": "loaded", "info": asdict(info), "run": run.index})
        elif name == "step":
            self.send(step_record(self.backend.step()))
        elif name == "new_run":
            self.send({"type": "run", "run": self.backend.new_run().index})
        elif name == "next_drafter":
            self.send({"type": "drafter", "spec": self.backend.next_drafter()})
        elif name == "whatif":
            self.send({"type": "whatif", "figures": self.backend.whatif()})
        elif name in ("save", "quit"):
            final = name == "quit" or bool(command.get("final"))
            self.send({"type": "saved", "path": self.backend.save(final=final)})
            return name != "quit"
        return True

    def answer(self, line: str) -> bool:
        """One line of input -> its records; False once the stream should end (quit)."""
        try:
            try:
                command = json.loads(line)
            except (ValueError, RecursionError):
                raise SpecviewError(f"not a JSON command: {quoted(line.strip())}") from None
            return self.handle(command)
        except SpecviewError as err:
            self.send({"type": "error", "message": " ".join(str(err).split()), "fatal": not self.loaded})
        except Exception as err:  # noqa: BLE001 - reported to the viewer, which decides; the stream lives on
            message = " ".join(f"{type(err).__name__}: {err}".split())
            self.send({"type": "error", "message": message, "fatal": not self.loaded})
        return True

    def serve(self, lines) -> int:
        for line in lines:
            if line.strip() and not self.answer(line):
                return 0
        if self.loaded:  # the viewer is gone without a quit: keep its profile
            self.backend.save(final=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    import os
    import signal

    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the viewer decides when to stop; EOF ends the stream
    settings = Settings(**json.loads(argv[0]))
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed (a library's warning) must not corrupt the stream
    # bytes that are not UTF-8 become U+FFFD: one error record for that line, not a UnicodeDecodeError that ends us
    commands = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    return Service(settings, out).serve(commands)
