"""The engine behind a stream: commands in, records out, one JSON object per line (docs/design.md, "Engine
stream"). The TUI runs it as a child process so that nothing it draws can slow the engine down: in one
process, Textual's rendering holds the GIL between the forward's small operators (a verify forward timed
1.7x slower under the TUI than in `specview run`). The step records are the `specview.events/1` step
records of `--jsonl`, plus what a viewer needs to draw them.

    python -m specview.service SETTINGS_JSON        # Settings as JSON (settings.py)

commands (stdin)                      records (stdout)
  {"cmd": "load"}                       {"type": "progress", "text": ..} ..., then {"type": "loaded", "info": {..}, "run": 0}
  {"cmd": "step", "k": 4}               {"type": "step", <specview.events/1 step record>, "texts": {id: text}, "prefill_ms": ..}
  {"cmd": "new_run", "k": 4}            {"type": "run", "run": 1}
  {"cmd": "next_drafter"}               {"type": "drafter", "spec": ..}
  {"cmd": "save", "final": false}       {"type": "saved", "path": ..}
  {"cmd": "quit"}                       (saves like final, then exits 0)
  any failure                           {"type": "error", "message": "one line", "fatal": bool}

End of input (the viewer is gone, however it died) saves the profile and exits: every exit path keeps it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from specview.backend.in_process import EngineBackend
from specview.backend.views import step_record
from specview.errors import SpecviewError
from specview.settings import Settings


class Service:
    def __init__(self, settings: Settings, out=sys.stdout):
        self.backend = EngineBackend(settings)
        self.out = out
        self.loaded = False

    def send(self, record: dict) -> None:
        self.out.write(json.dumps(record, allow_nan=False) + "\n")
        self.out.flush()

    def handle(self, command: dict) -> bool:
        """Run one command, answer it; False once the stream should end."""
        name = command.get("cmd")
        if "k" in command:
            self.backend.set_k(int(command["k"]))
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
        elif name in ("save", "quit"):
            final = name == "quit" or bool(command.get("final"))
            self.send({"type": "saved", "path": self.backend.save(final=final)})
            return name != "quit"
        else:
            raise SpecviewError(f"unknown command {name!r}")
        return True

    def serve(self, lines) -> int:
        for line in lines:
            if not line.strip():
                continue
            try:
                if not self.handle(json.loads(line)):
                    return 0
            except SpecviewError as err:
                self.send({"type": "error", "message": str(err), "fatal": not self.loaded})
            except Exception as err:  # noqa: BLE001 - reported to the viewer, which decides; the stream lives on
                self.send({"type": "error", "message": f"{type(err).__name__}: {err}", "fatal": not self.loaded})
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
    return Service(settings, out).serve(sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
