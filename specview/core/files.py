"""Files specview writes: atomically (a reader, or a crash mid-write, never leaves half a file), into
folders checked before any model loads (a bad --profile-dir fails in a second, not after the load)."""

from __future__ import annotations

import hashlib
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


RECORD_SUFFIX = ".record.json"  # beside a native artifact: its size and sha256 as written


def place_artifact(tmp: str, path: str) -> None:
    """Move a finished native artifact (a built library, a compiled package) from `tmp`, in `path`'s folder, into
    place, its record (size, sha256 hashed once here, and modification time) written beside it first: a loader
    checks it against the record before loading it (artifact_problem). A crash between the two leaves a record
    that does not match the file (or no file): the next start builds it again."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())  # the bytes on disk before the rename makes them the artifact
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    os.chmod(tmp, 0o666 & ~_UMASK)
    st = os.stat(tmp)  # a rename keeps it
    _write_record(path, st, digest)
    os.replace(tmp, path)


def _write_record(path: str, st: os.stat_result, digest: str) -> None:
    write_json_atomic(path + RECORD_SUFFIX, {"size": st.st_size, "sha256": digest, "mtime_ns": st.st_mtime_ns})


def artifact_problem(path: str) -> str | None:
    """None if the native artifact at `path` is the file its record describes, else what is wrong ("missing" if
    there is none). A native file is mapped, not read: one cut short or overwritten kills the process that loads
    it (SIGBUS, SIGSEGV) before any Python handler can act, so it is checked here first.

    Cheap where nothing happened: the size and the modification time as recorded mean the file was not written
    since (a stat and a small JSON read). Any other time (a copy of the cache, a write in place) means the file is
    hashed and compared with the recorded sha256; where it matches, the record takes the new time (best effort:
    a read-only cache hashes again at its next start)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as err:
        return f"it cannot be read: {err.strerror or err}"
    try:
        with open(path + RECORD_SUFFIX, encoding="utf-8") as f:
            record = json.load(f)
        want_size, want_digest = int(record["size"]), str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return "no record of its size and hash beside it (written by an older specview, or cut short)"
    if st.st_size != want_size:
        return f"it has {st.st_size} bytes, not the {want_size} it was written with"
    if record.get("mtime_ns") == st.st_mtime_ns:
        return None
    try:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as err:
        return f"it cannot be read: {err.strerror or err}"
    if digest != want_digest:
        return "its bytes are not the ones written (its sha256 differs)"
    try:
        _write_record(path, st, digest)
    except OSError:
        pass
    return None


ORPHAN_AGE_S = 24 * 3600  # a leftover without its process's id in its name: removed once this old


def remove_orphans(folder: str, prefix: str) -> None:
    """Leftovers of builds whose process is gone (killed mid-build): the files and folders in `folder` named
    `<prefix><pid>-...`, removed where no process has that id. A live process's is its build in flight (a pid
    reused meanwhile keeps one until it ends too); one without a pid in its name (an older specview's) is removed
    once ORPHAN_AGE_S old."""
    import shutil
    import time

    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        owner = name[len(prefix):].split("-", 1)[0]
        path = os.path.join(folder, name)
        try:
            if owner.isdigit() and _alive(int(owner)):
                continue
            if not owner.isdigit() and time.time() - os.lstat(path).st_mtime < ORPHAN_AGE_S:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


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


def is_writable_dir(path: str) -> bool:
    """Whether `path` (created if needed) takes a file: a probe written and removed, so the answer is the write's
    own (permissions, a read-only mount, a full disk)."""
    try:
        ensure_writable_dir(path, "")
    except SpecviewError:
        return False
    return True


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
