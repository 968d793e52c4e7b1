"""A TUI whose terminal goes away (a closed window, a killed tmux session) exits: it once stayed, orphaned, reading
the hung-up terminal's end of file in a loop at 100% of a core. The real app on a pseudo-terminal: the test closes
the terminal's master side and waits for the app to leave. CI has no terminal of its own: this one is made here,
and tests/support/tui_on_pty.py sets every signal disposition the case depends on."""

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
import tui_on_pty
from fake_engines import fake_engine

from specview.tui.terminal import DroppingWriter, HangupWatch, hung_up

# Drawn once the app is up, its input thread reading the terminal: SpecviewApp's, and EngineApp's (--attach to an
# engine) first line.
STARTED = {None: b"press space", "engine": b"exports counts"}
GENEROUS_S = 120  # a bound on a hang, not a measurement: the app leaves one hangup check (terminal.CHECK_S) after


def run_and_hang_up(mode: str, engine_url: str | None = None) -> int | None:
    """Start the TUI on a new pseudo-terminal (tui_on_pty.py `mode`; attached to the engine at `engine_url` if
    given), close the terminal once the app has drawn, and return its exit code (None: still running GENEROUS_S
    after the hangup; then it is killed)."""
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    argv = [sys.executable, tui_on_pty.__file__, mode] + ([engine_url] if engine_url else [])
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=env)
    os.close(slave)
    try:
        seen = b""
        started = STARTED["engine" if engine_url else None]
        deadline = time.monotonic() + GENEROUS_S  # the app draws again and again: a bound on the whole wait
        while started not in seen:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(master, 65536) if ready else b""
            assert chunk, f"the TUI did not start: {seen[-2000:]!r}"
            seen += chunk
        os.close(master)  # the terminal goes away
        master = None
        try:
            return proc.wait(timeout=GENEROUS_S)
        except subprocess.TimeoutExpired:
            return None
    finally:
        if master is not None:
            os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started: the TUI and its "shell"
            proc.wait()


def test_a_tui_whose_terminal_hangs_up_without_a_sighup_exits():
    """The session's leader (a shell) survives the hangup and passes no SIGHUP on: only the terminal says it."""
    assert run_and_hang_up("shell") == 0


def test_a_tui_that_gets_sighup_exits():
    assert run_and_hang_up("leader") == 0


@pytest.mark.parametrize("mode", ["leader", "shell"])
def test_a_tui_attached_to_an_engine_exits_when_its_terminal_goes(mode):
    """`--attach` to a serving engine runs EngineApp, which had no stop flag: the SIGHUP handler failed on it (an
    error in a loop callback, logged and dropped) and the app stayed."""
    with fake_engine("llama-server") as (_, url):
        assert run_and_hang_up(mode, url) == 0


class GoneTerminal:
    """A terminal's file after a hangup: every write and flush fails with EIO."""

    def write(self, text):
        raise OSError(5, "Input/output error")

    def flush(self):
        raise OSError(5, "Input/output error")


def test_the_writer_thread_outlives_a_gone_terminal():
    """Textual's writer thread died on the first failing write; the app's next writes then filled its queue and
    blocked the event loop that would have run the exit."""
    from textual.drivers._writer_thread import MAX_QUEUED_WRITES, WriterThread

    writer = WriterThread(DroppingWriter(GoneTerminal()))
    writer.start()
    done = threading.Thread(target=lambda: ([writer.write("frame") for _ in range(3 * MAX_QUEUED_WRITES)],
                                            writer.stop()), daemon=True)
    done.start()
    done.join(GENEROUS_S)
    assert not done.is_alive()  # every write queued and drained, and the thread stopped when told


def test_a_terminal_is_hung_up_once_its_master_side_closes():
    master, slave = os.openpty()
    try:
        assert not hung_up(slave)
        os.write(master, b"q")  # input waiting is not a hangup (and hung_up does not read it)
        assert not hung_up(slave)
        fired = threading.Event()
        watch = HangupWatch(slave, fired.set, every_s=0.01).start()
        os.close(master)
        master = None
        assert hung_up(slave) and fired.wait(GENEROUS_S)
        watch.close()
    finally:
        if master is not None:
            os.close(master)
        os.close(slave)


def test_the_hangup_watch_ends_when_closed_on_a_live_terminal():
    master, slave = os.openpty()
    fired = threading.Event()
    watch = HangupWatch(slave, fired.set).start()
    watch.close()  # at once, not at its next check
    os.close(master)
    os.close(slave)
    assert not watch._thread.is_alive() and not fired.is_set()
