"""The engine in a child process (specview/backend/engine_stream.py), behind the same Backend interface the app's
workers call: each method sends one command and blocks on its answer. The TUI process holds no model,
so what it draws cannot disturb the engine's timings, and a crash on either side cannot lose the
other's work (the child saves its profile when its input ends). No textual here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from dataclasses import asdict
from threading import Thread

from specview.backend.base import RemoteBackend
from specview.backend.views import RunInfo, SessionInfo, StepView, step_view
from specview.core.errors import SpecviewError, quoted

STDERR_LINES = 20  # the child's last stderr lines kept, to say why it died


def _field(record: dict, name: str, kind):
    """record[name] when it is a `kind`; else SpecviewError: the other side is not the engine stream we know."""
    value = record.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise SpecviewError(f"a malformed {record.get('type')} record: {name} is {quoted(json.dumps(value))}")
    return value

# The engine stream's entry (backend/engine_stream.py main): a product module, not a script run with -m.
CHILD = "import sys; from specview.backend.engine_stream import main; sys.exit(main(sys.argv[1:]))"


class ProcessBackend(RemoteBackend):
    def __init__(self, settings):
        super().__init__(settings.target, settings.draft, settings.k, settings.temperature)
        self.settings = settings
        self.proc: subprocess.Popen | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)
        self.steps = 0  # completed steps of the current run
        self.run_done = False

    # the stream ---------------------------------------------------------------------------------

    def _start(self) -> None:
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(asdict(self.settings))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,  # the terminal's signals go to the TUI, which tells the child what to do
        )
        Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            if line.strip():
                self.stderr_tail.append(line.rstrip())

    def _ask(self, command: dict, on_progress=None) -> dict:
        """Send one command -> its answer; progress records go to on_progress on the way."""
        if self.proc is None or self.proc.poll() is not None:
            raise SpecviewError(self._death())
        try:
            self.proc.stdin.write(json.dumps({**command, "k": self.k}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SpecviewError(self._death()) from None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                raise SpecviewError(self._death())
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                record = None
            if not isinstance(record, dict) or not isinstance(record.get("type"), str):
                # not a record: something in the child wrote to its stdout (a C library's print); keep it
                # for the death message and read on
                self.stderr_tail.append(f"stdout: {line.strip()[:200]}")
                continue
            if record["type"] == "progress":
                if on_progress:
                    on_progress(str(record.get("text", "")))
                continue
            if record["type"] == "error":
                raise SpecviewError(" ".join(str(record.get("message", "the engine failed")).split()))
            return record

    def _death(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        last = next((line for line in reversed(self.stderr_tail) if line.strip()), "")
        return f"the engine process ended (exit {code})" + (f": {last}" if last else "")

    # Backend --------------------------------------------------------------------------------------

    def load(self, on_progress):
        self._start()
        with self.lock:
            record = self._ask({"cmd": "load"}, on_progress)
        try:
            info = SessionInfo(**_field(record, "info", dict))
        except TypeError as err:
            raise SpecviewError(f"a malformed loaded record ({quoted(str(err))})") from None
        self.draft = info.draft
        return info, RunInfo(_field(record, "run", int))

    def step(self) -> StepView:
        with self.lock:
            view = step_view(self._ask({"cmd": "step"}))
        self.steps += 1
        self.run_done = view.step.stop_reason is not None
        return view

    def new_run(self) -> RunInfo:
        with self.lock:
            record = self._ask({"cmd": "new_run"})
        self.steps, self.run_done = 0, False
        return RunInfo(_field(record, "run", int))

    def next_drafter(self) -> str:
        with self.lock:
            self.draft = _field(self._ask({"cmd": "next_drafter"}), "spec", str)
        return self.draft

    def _save(self, final: bool) -> str | None:
        if self.proc is None:
            return None
        if final:  # the last word: the child saves, answers and exits
            path = _field(self._ask({"cmd": "quit"}), "path", (str, type(None)))
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
            return path
        return _field(self._ask({"cmd": "save", "final": False}), "path", (str, type(None)))

    def _whatif(self) -> dict | None:
        if self.proc is None:
            return None
        figures = self._ask({"cmd": "whatif"}).get("figures")
        return figures if isinstance(figures, dict) else None

    def close(self) -> None:
        """The app is gone: end the child's input (it saves its profile and exits)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
