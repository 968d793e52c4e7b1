"""A disk cache of models converted from GGUF, so only the first start pays for the conversion.

transformers reads a .gguf file slowly: it parses the metadata with the pure-Python `gguf` reader
(three times: tokenizer, config, weights) and dequantizes every tensor: tens of seconds for the bundled
SmolLM2-135M. The result is an ordinary float32 model, so we save it once with
`save_pretrained` (safetensors weights + config + tokenizer files) and later load that folder through
the normal local-folder path, many times faster.

Layout: `<cache dir>/<name>-<key>/` where the cache dir is $SPECVIEW_CACHE_DIR, else
$XDG_CACHE_HOME/specview, else ~/.cache/specview, and the key is a hash of:
  - the sha256 of the GGUF file's bytes. A full hash and not (path, size, mtime): it is sound (a file
    edited or replaced in place, or a copy elsewhere, maps to the right entry) and cheap enough here
    (a small share of a warm start for the 98 MB bundled file, from the page cache);
  - the torch and transformers versions (the conversion, and the saved format, may change with them);
  - FORMAT, bumped when what we write changes.

An entry is complete when its marker file (MARKER, written last) lists every file with its size and
the files match: a truncated or missing file, bad JSON or a bad safetensors header marks it broken,
and it is rebuilt. Entries are built in a temporary folder in the cache dir and renamed into place,
so a reader never sees half an entry; a leftover temporary folder (a killed build, its process's id in
its name) is never read and is removed by the next start once that process is gone. One conversion at a
time (an flock on `<entry>.lock`, core/locks.py): a second start waits for the first's entry and loads it. A new entry removes the one it supersedes (the same key at an older
FORMAT), so a FORMAT bump does not leave a dead copy of every converted model behind. Writing the cache
is best effort: if it fails, the model built from the source is still returned, with a one-line warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from specview.core.files import cache_dir

FORMAT = 2  # bump when what an entry holds changes (2: the added tokens listed in tokenizer_config.json)
MARKER = "specview-cache.json"
TMP_PREFIX = ".tmp-"

log = logging.getLogger(__name__)
T = TypeVar("T")


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def gguf_key_inputs(gguf_path: str | os.PathLike) -> dict:
    """What a converted GGUF depends on (see the module docstring)."""
    import torch
    import transformers

    return {"format": FORMAT, "source_sha256": file_sha256(gguf_path), "torch": torch.__version__,
            "transformers": transformers.__version__}


def entry_path(name: str, key_inputs: dict, root: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key_inputs, sort_keys=True).encode()).hexdigest()[:24]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or "model"
    return (root or cache_dir()) / f"{safe}-{digest}"


def cached_load(
    key_inputs: dict,
    build: Callable[[], T],
    save: Callable[[T, Path], None],
    load: Callable[[Path], T],
    name: str = "model",
    root: Path | None = None,
) -> tuple[T, str]:
    """`load(entry)` if a complete entry exists for `key_inputs`, else `build()`, `save(obj, folder)`
    into a new entry and return the built object. Returns (object, how): how is "hit", "built" or
    "built, not cached" (the write failed)."""
    from specview.core import locks

    entry = entry_path(name, key_inputs, root)
    _remove_stale_tmp(entry.parent)  # a conversion killed mid-save left its temporary folder: gone now
    problem = entry_problem(entry)
    if problem is None:
        try:
            return load(entry), "hit"
        except Exception as err:  # noqa: BLE001 - whatever the reason, the source can rebuild it
            problem = f"it does not load: {_short(err)}"
    # one conversion at a time: a second start waits for the first's entry instead of converting too
    with locks.held(f"{entry}.lock", f"the converted model {entry.name}"):
        if not problem.startswith("it does not load"):  # another start may have written it while this one waited
            problem = entry_problem(entry)
            if problem is None:
                try:
                    return load(entry), "hit"
                except Exception as err:  # noqa: BLE001
                    problem = f"it does not load: {_short(err)}"
        if problem != "missing":
            log.warning("specview: cache entry %s is broken (%s); rebuilding it", entry, problem)
        return _build_and_write(entry, key_inputs, build, save)


def _build_and_write(entry: Path, key_inputs: dict, build, save) -> tuple:
    obj = build()
    try:
        _write_entry(entry, key_inputs, lambda folder: save(obj, folder))
    except Exception as err:  # noqa: BLE001 - best effort: a read-only or full disk must not stop a run
        log.warning("specview: could not write the cache entry %s (%s)", entry, _short(err))
        return obj, "built, not cached"
    return obj, "built"


def entry_problem(entry: Path) -> str | None:
    """None if `entry` is a complete, sound-looking entry, else what is wrong with it (for messages
    and tests). Checks sizes, JSON and safetensors headers: cheap (no hashing of the weights)."""
    marker = entry / MARKER
    if not marker.is_file():
        return "missing" if not entry.exists() else f"no {MARKER} (incomplete)"
    fname = MARKER
    try:
        files = json.loads(marker.read_text(encoding="utf-8"))["files"]
        for fname, size in files.items():
            path = entry / fname
            if not path.is_file():
                return f"{fname} is missing"
            if path.stat().st_size != size:
                return f"{fname} has {path.stat().st_size} bytes, not {size}"
            if fname.endswith(".json") and size < 1_000_000:  # tokenizer.json (MBs) is checked by its load
                json.loads(path.read_text(encoding="utf-8"))
            elif fname.endswith(".safetensors"):
                check_safetensors(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{fname}: {_short(err)}"
    return None


def check_safetensors(path: str | os.PathLike) -> None:
    """The header (8-byte length + JSON) parses and the tensors' byte ranges fill the file exactly."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("no safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ValueError(f"header length {n} is past the end of the file ({size} bytes)")
        header = json.loads(f.read(n))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise ValueError(f"the tensors end at byte {8 + n + end}, the file has {size}")


def _write_entry(entry: Path, key_inputs: dict, save: Callable[[Path], None]) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(entry.parent)
    # its process's id in the name: the next start removes it once that process is gone (killed mid-save)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-{entry.name}-", dir=entry.parent))
    try:
        save(tmp)
        files = {}
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                _fsync(path)  # contents on disk before the rename makes them visible
                files[str(path.relative_to(tmp))] = path.stat().st_size
        marker = {"key": key_inputs, "files": files, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")  # last: marks it complete
        _fsync(tmp / MARKER)
        if entry.exists():  # a broken entry: out of the way first (a folder cannot be renamed onto a full one)
            _discard(entry)
        try:
            os.replace(tmp, entry)
        except OSError:
            if entry_problem(entry) is not None:  # not another process that finished the same entry first
                raise
        _fsync(entry.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _remove_superseded(entry, key_inputs)


def _remove_superseded(entry: Path, key_inputs: dict) -> None:
    """Remove the entries this one replaces: the same key but an older FORMAT (the same source, torch and
    transformers; an int4 entry's own settings too), which this version never reads. Without this, every FORMAT
    bump would leave each user a dead copy of every converted model (540 MB for the bundled one). Entries of
    other torch or transformers versions are left alone: another environment may share the cache."""
    if not isinstance(key_inputs.get("format"), int):
        return
    rest = {k: v for k, v in key_inputs.items() if k != "format"}
    try:
        others = [p for p in entry.parent.iterdir() if p != entry and p.is_dir() and not p.name.startswith(TMP_PREFIX)]
    except OSError:
        return
    for other in others:
        try:
            old = json.loads((other / MARKER).read_text(encoding="utf-8"))["key"]
            superseded = (isinstance(old.get("format"), int) and old["format"] < key_inputs["format"]
                          and {k: v for k, v in old.items() if k != "format"} == rest)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not an entry (the thin kernels' build, the compiled packages) or not a readable one
        if not superseded:
            continue
        try:
            _discard(other)
        except OSError:
            continue


def _discard(entry: Path) -> None:
    """Remove an entry: moved aside in one rename (a reader sees it whole or missing, never half deleted), then
    deleted; whatever a failed deletion leaves is a temporary folder, swept once a day old."""
    trash = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-old-", dir=entry.parent))
    os.replace(entry, trash / "entry")
    shutil.rmtree(trash, ignore_errors=True)


def _remove_stale_tmp(root: Path) -> None:
    """Temporary folders of conversions whose process is gone (core/files.remove_orphans; an older specview's,
    without a process id in the name, once a day old)."""
    from specview.core.files import remove_orphans

    remove_orphans(str(root), TMP_PREFIX)


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def _short(err: Exception) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 200 else text[:199] + "…"
