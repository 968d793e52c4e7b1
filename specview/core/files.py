"""Files specview writes: atomically (a reader, or a crash mid-write, never leaves half a file), into
folders checked before any model loads (a bad --profile-dir fails in a second, not after the load)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specview.core.errors import SpecviewError

_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: str, suffix: str = "") -> Iterator[str]:
    """A temp path in `path`'s folder to write to; renamed over `path` when the block succeeds, removed
    when it fails (a full disk, Ctrl-C): `path` is either the old file or the whole new one."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; these are ordinary files
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: str, write: Callable[[object], None]) -> None:
    """`write(f)` into a text file that appears at `path` only once complete (flushed to disk)."""
    with atomic_path(path, ".json") as tmp, open(tmp, "w", encoding="utf-8") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_json_atomic(path: str, obj, indent: int | None = None) -> None:
    write_text_atomic(path, lambda f: json.dump(obj, f, allow_nan=False, indent=indent))


def save_figure(fig, json_path: str, dpi: int = 110) -> list[str]:
    """A matplotlib figure beside its JSON document, as `.png` and `.svg` (each written atomically)."""
    stem = json_path[: -len(".json")] if json_path.endswith(".json") else json_path
    paths = [stem + ".png", stem + ".svg"]
    for path in paths:
        with atomic_path(path, os.path.splitext(path)[1]) as tmp:
            fig.savefig(tmp, dpi=dpi)
    return paths


def ensure_writable_dir(path: str, option: str) -> None:
    """Create `path` if needed and prove it takes a file; SpecviewError (one line) naming `option` if not."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise SpecviewError(f"{option}: cannot write to {path}: {err.strerror or err}") from err


def cache_dir() -> Path:
    """specview's cache folder: converted models, compiled forwards, built kernels, measured figures."""
    if os.environ.get("SPECVIEW_CACHE_DIR"):
        return Path(os.environ["SPECVIEW_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specview"


def clean_name(spec: str) -> str:
    """A MODEL spec as a file name part: no / or @ (a local path keeps its last folder name)."""
    name, _, dtype = spec.partition("@")
    if os.sep in name and os.path.exists(os.path.expanduser(name)):
        name = os.path.basename(os.path.normpath(os.path.expanduser(name)))
    cleaned = re.sub(r"[^A-Za-z0-9._+-]+", "_", name + (f"_{dtype}" if dtype else "")).strip("._-")
    return cleaned[-60:] or "model"
