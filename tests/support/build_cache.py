"""Folders under build/ (ignored by git) that the test sessions of a checkout keep, as a user's cache is kept between
starts: what they hold is built from specview/cpu's code, so there is one folder per version of that code (the
digest of its files), the older ones removed."""

import hashlib
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def code_digest() -> str:
    """The forward's code: every .py and .cpp file of specview/cpu, and the int4 copies it reads."""
    code = sorted(p for p in (ROOT / "specview" / "cpu").rglob("*") if p.suffix in (".py", ".cpp"))
    code.append(ROOT / "specview" / "models" / "int4.py")
    return hashlib.sha256(b"".join(p.read_bytes() for p in code)).hexdigest()[:16]


def kept_folder(name: str) -> Path:
    """build/<name>/<code digest>, made; the folders of other digests removed."""
    digest = code_digest()
    parent = ROOT / "build" / name
    for old in parent.glob("*") if parent.is_dir() else ():
        if old.name != digest:
            shutil.rmtree(old, ignore_errors=True)
    folder = parent / digest
    folder.mkdir(parents=True, exist_ok=True)
    return folder
