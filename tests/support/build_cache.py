"""The builds the test sessions of a machine keep between them, as a user's cache is kept between starts: the thin
kernels' library, inductor's cache, the AOT packages of the tiny models, the kernels each probe chose for them.

They live outside the checkout ($SPECVIEW_TEST_BUILDS, else $XDG_CACHE_HOME/specview-test-builds or
~/.cache/specview-test-builds), as ccache keeps a compiler's objects: a fresh clone of code this machine has tested
before (CI's every run) loads them instead of spending most of its time building them again. What they hold is built
from specview/cpu's code, so there is one folder per version of that code on this torch and this CPU (a digest of
all three); the most recently used few are kept. The first session after an edit of specview/cpu builds them again:
`make test-cold` runs the suite on an empty folder, as a machine's first run does. The tests of building itself
(test_thin_kernels, test_cache_faults, test_build_faults) build into folders of their own, except test_compiled's
AOT packages test: it checks its packages were built where its kept folder was empty, and loaded where it was not."""

import hashlib
import os
import shutil
import time
from pathlib import Path

import torch

from specview.core import host

ROOT = Path(__file__).resolve().parents[2]
KEEP = 4  # versions of the code kept per folder: a few branches tested in turn each find theirs


def builds_root() -> Path:
    if os.environ.get("SPECVIEW_TEST_BUILDS"):
        return Path(os.environ["SPECVIEW_TEST_BUILDS"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specview-test-builds"


def code_digest() -> str:
    """The forward's code (every .py and .cpp file of specview/cpu, and the int4 copies it reads), torch's version
    and the CPU (its name and flags: a VM image can wake up on another)."""
    code = sorted(p for p in (ROOT / "specview" / "cpu").rglob("*") if p.suffix in (".py", ".cpp"))
    code.append(ROOT / "specview" / "models" / "int4.py")
    context = f"{torch.__version__}/{host.cpu_name()}/{'+'.join(host.cpu_flags())}".encode()
    return hashlib.sha256(b"".join(p.read_bytes() for p in code) + context).hexdigest()[:16]


def kept_folder(name: str) -> Path:
    """<builds_root>/<name>/<digest>, made and marked used now; beyond the KEEP most recently used, older digests'
    folders are removed."""
    parent = builds_root() / name
    folder = parent / code_digest()
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)
    others = sorted((p for p in parent.iterdir() if p.is_dir() and p != folder), key=lambda p: p.stat().st_mtime)
    for old in others[:max(0, len(others) - (KEEP - 1))]:
        if time.time() - old.stat().st_mtime > 3600:  # not one another session of this machine is using right now
            shutil.rmtree(old, ignore_errors=True)
    return folder
