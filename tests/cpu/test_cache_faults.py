"""The first start's files, broken as a disk, a crash or a second process breaks them (issues 50 §3, 51): real
`specview run` processes on a tiny Llama in a cache folder of their own, the native artifacts damaged in place.

A native file is mapped, not read: the kernel library cut to half its size killed every later start with SIGBUS,
and a compiled package with 64 KiB overwritten (its size kept) with SIGSEGV. Each is checked against the size and
hash recorded when it was written, and a bad one is built again with one line saying so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from build_cache import kept_folder
from test_compiled import needs_compiler

from specview.core import host

REPO = Path(__file__).resolve().parents[2]
# a cold start builds the tiny target's packages and the kernel library (minutes on a busy machine); the others
# build one thing again each
pytestmark = pytest.mark.timeout(3600)
needs_thin_build = pytest.mark.skipif(not ({"avx2", "fma"} <= host.all_cpu_flags() and shutil.which("c++")),
                                      reason="no AVX2, FMA or C++ compiler here: no kernel library to break")


def run(target: str, cache: Path) -> tuple[subprocess.CompletedProcess, list[int]]:
    """`specview run` greedy on the compiled forward (ahead-of-time packages, the thin kernels' products) -> (the process,
    its tokens)."""
    env = {**os.environ, "SPECVIEW_CACHE_DIR": str(cache), "SPECVIEW_AOT": "1", "SPECVIEW_PACKED_LINEAR": "thin",
           "PYTHONPATH": str(REPO)}
    env.pop("SPECVIEW_COMPILE", None)
    done = subprocess.run([sys.executable, "-m", "specview", "run", "--target", target, "--method", "autoregressive",
                           "-N", "6", "--temperature", "0", "--compile", "on", "--threads", "1", "--prompt", "w1 w2",
                           "--ignore-eos", "--jsonl", "-", "--quiet"], env=env, capture_output=True, text=True,
                          timeout=1800)
    ends = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    tokens = next((r["generated_ids"] for r in ends if r.get("type") == "end"), [])
    return done, tokens


@pytest.fixture(scope="module")
def warm(tmp_path_factory, small_llama_pair):
    """A cache folder after one start: the kernel library and the packages built, the greedy tokens they give. Kept
    between the sessions of this machine (build_cache.py; the tests damage copies of it): a later session's start
    loads what the first one built, as a user's second start does."""
    target = small_llama_pair[0].spec
    cache = kept_folder("cache-faults-warm")
    done, tokens = run(target, cache)
    assert done.returncode == 0 and tokens, done.stderr[-3000:]
    return target, cache, tokens


def damaged_copy(warm, tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    shutil.copytree(warm[1], cache, symlinks=False)  # a copy: new times, the same bytes
    return cache


def one_line(stderr: str, words: str) -> list[str]:
    return [line for line in stderr.splitlines() if words in line]


def check_recovers(warm, cache: Path, what: str) -> None:
    target, _, tokens = warm
    done, again = run(target, cache)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert again == tokens
    said = one_line(done.stderr, "is damaged")
    assert len(said) == 1 and what in said[0] and "building it again" in said[0], done.stderr[-3000:]
    done, again = run(target, cache)  # and the next start loads what this one built, saying nothing
    assert done.returncode == 0 and again == tokens and not one_line(done.stderr, "is damaged"), done.stderr[-3000:]


@needs_compiler
@needs_thin_build
def test_a_kernel_library_cut_to_half_is_built_again(warm, tmp_path):
    """The one test of a library built again (a disk that filled up, a copy interrupted): end to end, in real
    starts."""
    cache = damaged_copy(warm, tmp_path)
    [library] = (cache / "thin_kernels").glob("specview_thin_*.so")
    os.truncate(library, library.stat().st_size // 2)
    check_recovers(warm, cache, "thin-kernel library")
    assert library.stat().st_size > 10_000  # built again, in place
    assert not [p for p in library.parent.iterdir() if p.name.startswith("build-")]  # its scratch folder gone


@needs_compiler
def test_a_package_with_64_kib_overwritten_is_built_again(warm, tmp_path):
    cache = damaged_copy(warm, tmp_path)
    package = max((cache / "aot").rglob("*.pt2"), key=lambda p: p.stat().st_size)
    size = package.stat().st_size
    with open(package, "r+b") as f:
        f.seek(size // 3)
        f.write(bytes(range(256)) * 256)  # 64 KiB of other bytes, the size kept
    assert package.stat().st_size == size
    check_recovers(warm, cache, "compiled package")


@needs_compiler
def test_a_warm_cache_loads_without_opening_a_lock_for_writing(warm, tmp_path):
    """Loading what is there needs no lock: a read-only warm cache (where no lock file can be opened for writing)
    loads its packages and its kernel library instead of falling back to transformers' forward."""
    target, _, tokens = warm
    cache = damaged_copy(warm, tmp_path)
    for lock in cache.rglob("*.lock"):
        lock.unlink()
    done, again = run(target, cache)
    assert done.returncode == 0 and again == tokens, done.stderr[-3000:]
    assert not list(cache.rglob("*.lock"))  # nothing was built: no lock was asked for
