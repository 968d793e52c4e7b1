"""A first start that meets another, or is killed (issue 51 items 2-5): the lock a start waits on
(core/locks.py), the leftovers of a killed build, the compilers a killed start leaves running, and what it says.
Real processes and real signals, each step waited on by what can be observed (a line read, a process seen
stopped), never by a clock: a time limit here is only a backstop for a test that fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specview.core import files, locks
from specview.cpu import builds
from specview.cpu.matmul import thin_kernels

REPO = Path(__file__).resolve().parents[2]
BACKSTOP_S = 120

HOLDER = """
import os, signal, sys
from specview.core import locks
with locks.held(sys.argv[1], "the test's thing") as got:
    print("held" if got else "not held", flush=True)
    if sys.argv[2] == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        sys.stdin.readline()
"""

WAITER = """
import sys
from specview.core import locks
from specview.core.stopping import Stop
with Stop().on_signals():  # as every command: a signal only sets the flag
    with locks.held(sys.argv[1], "the test's thing") as got:
        print("held" if got else "went on without it", flush=True)
"""


def python(code: str, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **kw.pop("env", {})}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)


@pytest.fixture
def holder(tmp_path):
    started = []

    def start(how: str) -> subprocess.Popen:
        process = python(HOLDER, str(tmp_path / "thing.lock"), how, stdin=subprocess.PIPE)
        started.append(process)
        assert process.stdout.readline().strip() == "held"
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_start_goes_on_past_a_lock_held_by_a_stopped_start_and_says_so(tmp_path, holder):
    """A first start suspended (Ctrl-Z) while it holds a lock may never go on: the next start says who holds it
    and goes on without it (the writes are atomic: the lock only saves doing the work twice)."""
    first = holder("stop")
    _, status = os.waitpid(first.pid, os.WUNTRACED)  # returns once it has stopped itself
    assert os.WIFSTOPPED(status)
    second = python(WAITER, str(tmp_path / "thing.lock"))
    out, err = second.communicate(timeout=BACKSTOP_S)
    assert second.returncode == 0 and out.strip() == "went on without it", err
    [line] = err.splitlines()
    assert f"locked by process {first.pid}, which is stopped" in line and "the test's thing" in line


def test_a_start_waiting_on_a_lock_says_what_for_and_ends_on_the_first_sigterm(tmp_path, holder):
    first = holder("hold")
    second = python(WAITER, str(tmp_path / "thing.lock"))
    line = second.stderr.readline()  # said before it waits (without -v)
    assert f"waiting for process {first.pid} to finish building the test's thing" in line, line
    second.send_signal(signal.SIGTERM)
    try:
        second.wait(timeout=BACKSTOP_S)
    except subprocess.TimeoutExpired:
        second.kill()
        pytest.fail("the first SIGTERM did not end the wait")
    assert second.returncode != 0 and second.stdout.read() == ""  # ended, not given the lock


def test_a_start_goes_on_without_a_lock_still_held_past_the_limit(tmp_path, holder):
    holder("hold")
    second = python(WAITER, str(tmp_path / "thing.lock"), env={"SPECVIEW_LOCK_WAIT_S": "0"})
    out, err = second.communicate(timeout=BACKSTOP_S)
    assert out.strip() == "went on without it" and "still locked after 0 s" in err, err


def test_a_lock_that_cannot_be_written_is_said_and_the_start_goes_on(tmp_path, capsys):
    """A read-only cache: no lock file can be opened for writing (a regular file stands where its folder would be:
    unwritable even for root). One line says so, without -v, and the caller goes on."""
    (tmp_path / "not-a-folder").write_text("")
    with locks.held(str(tmp_path / "not-a-folder" / "thing.lock"), "the test's thing") as got:
        assert got is False
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("specview: cannot write to ") and "the test's thing is built without its lock" in line


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid  # reaped: no process has this id now


def test_the_scratch_folders_of_a_killed_kernel_build_are_removed_by_the_next_start(tmp_path, monkeypatch):
    """Only a build whose process is gone: a live process's folder is its build in flight."""
    monkeypatch.setattr(thin_kernels, "build_dir", lambda: str(tmp_path))
    monkeypatch.setattr(thin_kernels, "_defined", lambda: False)
    killed, live = tmp_path / f"build-{dead_pid()}-ab12", tmp_path / f"build-{os.getpid()}-cd34"
    for folder in (killed, live):
        folder.mkdir()
        (folder / "thin_f32.o").write_bytes(b"\0" * 64)
    built = []
    monkeypatch.setattr(thin_kernels, "_build", lambda folder, library: built.append(library))
    monkeypatch.setattr(thin_kernels.torch.ops, "load_library", lambda library: None)
    thin_kernels._load()
    assert built and not killed.exists() and live.exists()


def test_a_package_being_written_by_a_killed_build_is_removed_by_the_next_one(tmp_path):
    killed = tmp_path / f".partial-{dead_pid()}-layer-rows-0123.pt2"
    live = tmp_path / f".partial-{os.getpid()}-head-4567.pt2"
    for path in (killed, live):
        path.write_bytes(b"PK" + b"\0" * 64)
    files.remove_orphans(str(tmp_path), ".partial-")
    assert not killed.exists() and live.exists()


COMPILING = """
import subprocess, sys
from specview.core.children import compilers_die_with_this_process
compilers_die_with_this_process()
compiler = subprocess.Popen(["c++", "-c", "kernel.cpp"])
print(compiler.pid, flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_compiler_started_by_a_build_ends_when_specview_is_killed(tmp_path):
    """kill -9 of a start in its C++ build left the compiler running: it gets PR_SET_PDEATHSIG. The compiler here is
    a stand-in named c++ on PATH that would run for ten minutes."""
    fake = tmp_path / "bin" / "c++"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    start = python(COMPILING, stdin=subprocess.PIPE, env={"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"})
    compiler = int(start.stdout.readline())
    try:
        start.kill()
        start.wait()
        for _ in range(BACKSTOP_S * 10):  # polled: the kernel signals it as its parent dies, it ends at once
            if process_gone(compiler):
                break
            time.sleep(0.1)
        assert process_gone(compiler), "the compiler is still running after its start was killed"
    finally:
        if not process_gone(compiler):
            os.kill(compiler, signal.SIGKILL)


def process_gone(pid: int) -> bool:
    state = locks.process_state(pid)
    if state is None:
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # ended, not yet reaped by its new parent


def test_inductors_cache_goes_into_specviews_cache_folder(tmp_path):
    """An empty specview cache folder is a cold start: inductor had written its default (the system's temp folder)
    into TORCHINDUCTOR_CACHE_DIR before specview's configure ran, and kept its kernels there."""
    code = ("import os, torch\n"
            "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
            "cache_dir()  # inductor asked first: it sets the variable to its default\n"
            "from specview.cpu.forward import aot_compile\n"
            "aot_compile.configure()\n"
            "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", code], env={**env, "SPECVIEW_CACHE_DIR": str(tmp_path),
                                                              "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=BACKSTOP_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith(str(tmp_path / "inductor")), done.stdout


def test_a_cache_that_cannot_be_written_is_not_said_to_keep_a_builds_parts(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path / "file" / "cache"))
    note = builds.unfinished_note("tiny", "building head")
    assert "nothing it built is kept" in note and "are kept" not in note
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path / "cache"))
    assert "the parts it finished are kept in" in builds.unfinished_note("tiny", "building head")


def test_an_artifact_is_checked_against_the_size_and_hash_it_was_written_with(tmp_path, monkeypatch):
    path = str(tmp_path / "lib.so")
    (tmp_path / ".tmp-lib").write_bytes(bytes(range(256)) * 1024)
    files.place_artifact(str(tmp_path / ".tmp-lib"), path)
    assert files.artifact_problem(path) is None and not (tmp_path / ".tmp-lib").exists()
    hashed = []
    real = files.hashlib.file_digest
    monkeypatch.setattr(files.hashlib, "file_digest", lambda f, name: hashed.append(f.name) or real(f, name))
    assert files.artifact_problem(path) is None and not hashed  # untouched since: a stat, no hash

    os.utime(path, ns=(1, 1))  # copied elsewhere: another time, the same bytes
    assert files.artifact_problem(path) is None and hashed == [path]
    assert files.artifact_problem(path) is None and hashed == [path]  # the record took the new time

    with open(path, "r+b") as f:  # overwritten in place, the size kept
        f.seek(4096)
        f.write(b"\0" * 65536)
    assert "sha256 differs" in files.artifact_problem(path)
    os.truncate(path, 1000)
    assert files.artifact_problem(path) == "it has 1000 bytes, not the 262144 it was written with"
    os.unlink(path + files.RECORD_SUFFIX)
    assert files.artifact_problem(path).startswith("no record of its size and hash")
    os.unlink(path)
    assert files.artifact_problem(path) == "missing"
