"""`--py-spy`: sample our own process with `py-spy record -f speedscope`.

py-spy runs in its own process session, so a Ctrl-C at the terminal reaches the run first; the run
then stops py-spy with SIGINT, on which it writes its file. Sampling needs ptrace rights on this
process: when the system forbids it we say so in one line and go on without it. Under Yama
ptrace_scope=1 a child may not trace its parent, so py-spy is started behind a shell that waits until
we have named it our tracer (prctl PR_SET_PTRACER) before it execs py-spy.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PR_SET_PTRACER = 0x59616D61
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
ATTACH_WAIT_S = 2.0  # how long to watch py-spy start before the run goes on
PTRACE_HELP = ("py-spy cannot read this process (ptrace not permitted): run as root, give py-spy CAP_SYS_PTRACE "
               "or set kernel.yama.ptrace_scope=0; continuing without py-spy")


def find_py_spy() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def yama_scope() -> int | None:
    try:
        with open(YAMA_SCOPE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


class PySpy:
    def __init__(self, out_path: str, rate: int = 100):
        self.out_path = out_path
        self.rate = rate
        self.proc: subprocess.Popen | None = None
        self.log = None

    def start(self) -> str | None:
        """Start sampling -> None when py-spy runs, else the one-line reason it does not."""
        exe = find_py_spy()
        if exe is None:
            return "py-spy is not installed (pip install py-spy); continuing without it"
        if yama_scope() is not None and yama_scope() >= 2 and os.geteuid() != 0:
            return PTRACE_HELP
        cmd = [exe, "record", "-f", "speedscope", "-o", self.out_path, "-r", str(self.rate),
               "--pid", str(os.getpid())]
        self.log = tempfile.TemporaryFile(mode="w+")
        gate = yama_scope() == 1 and sys.platform.startswith("linux")
        if gate:  # the shell waits for one line on stdin, then becomes py-spy (same pid: our named tracer)
            cmd = ["/bin/sh", "-c", 'read _ && exec "$@"', "sh", *cmd]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if gate else subprocess.DEVNULL,
                                         stdout=self.log, stderr=self.log, start_new_session=True)
        except OSError as err:
            return f"py-spy could not start ({err.strerror}); continuing without it"
        if gate:
            try:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, self.proc.pid, 0, 0, 0)
                self.proc.stdin.write(b"go\n")
                self.proc.stdin.close()
            except (OSError, AttributeError):
                pass
        deadline = time.monotonic() + ATTACH_WAIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return self._failure()
            if "Sampling process" in self._log_text():
                return None
            time.sleep(0.05)
        return None

    def stop(self, timeout: float = 60.0) -> str:
        """SIGINT py-spy, let it write its file -> a one-line note."""
        proc, self.proc = self.proc, None
        if proc is None:
            return "py-spy was not running"
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return "py-spy did not finish writing in time; its profile is missing"
        if os.path.exists(self.out_path) and os.path.getsize(self.out_path) > 0:
            return f"py-spy profile written: {self.out_path} (open it in https://www.speedscope.app)"
        return self._failure()

    def _log_text(self) -> str:
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read()

    def _failure(self) -> str:
        text = self._log_text()
        low = text.lower()
        if "permission" in low or "ptrace" in low or "operation not permitted" in low:
            return PTRACE_HELP
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "no output")
        return f"py-spy stopped ({last}); continuing without it"
