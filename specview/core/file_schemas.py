"""The files specview writes and reads back: the profile (specview.profile/1), the bench file
(specview.bench/1) and the eval file (specview.eval/1). One home for their schema names and for load(), which
reads one and checks it is what it says (`specview report`, `eval --resume`). No torch, no rendering.

A file that is not one of these (missing, empty, truncated, foreign JSON, another schema version)
raises SpecviewError with one line saying what it is instead; the CLI prints it and exits 2.
"""

from __future__ import annotations

import glob
import json
import os

from specview.core.errors import SpecviewError

PROFILE_SCHEMA = "specview.profile/1"
BENCH_SCHEMA = "specview.bench/1"
EVAL_SCHEMA = "specview.eval/1"
DISTS_SCHEMA = "specview.dists/1"  # --record-dists, beside a profile (profiling/dists.py writes, whatif reads)
KNOWN = {"specview.profile": PROFILE_SCHEMA, "specview.bench": BENCH_SCHEMA, "specview.eval": EVAL_SCHEMA}


def load(path: str) -> tuple[str, dict]:
    """-> (path, document) of a profile, bench or eval file, or SpecviewError saying what is wrong in one line."""
    if os.path.isdir(path):
        path = newest_profile(path)
    if not os.path.exists(path):
        raise SpecviewError(f"no such file: {path}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise SpecviewError(f"cannot read {path}: {err.strerror}") from err
    if not raw.strip():
        raise SpecviewError(f"{path} is empty, not a specview profile or bench file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecviewError(f"{path} is not a text (UTF-8 JSON) file: not a specview profile or bench file") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecviewError(_bad_json(path, text, err)) from None
    except (RecursionError, ValueError):  # [[[[...: nested past the parser's stack; 5000-digit numbers
        raise SpecviewError(f"{path} is not a specview file: JSON nested too deeply or numbers too long") from None
    if not isinstance(doc, dict):
        raise SpecviewError(f"{path} holds a JSON {type(doc).__name__}, not a specview profile or bench file")
    if "traceEvents" in doc:
        raise SpecviewError(f"{path} is a Chrome trace: open it in https://ui.perfetto.dev; {_profile_beside(path)}")
    if "speedscope" in str(doc.get("$schema", "")):
        raise SpecviewError(f"{path} is a speedscope file: open it in https://www.speedscope.app; "
                            f"{_profile_beside(path)}")
    schema = doc.get("schema")
    if not isinstance(schema, str):
        raise SpecviewError(f"{path} is JSON but not a specview profile or bench file (no \"schema\" field)")
    family, _, version = schema.partition("/")
    if family not in KNOWN:
        raise SpecviewError(f"{path} has schema {schema!r}: not a specview profile or bench file")
    if schema != KNOWN[family]:
        raise SpecviewError(f"{path} has schema {schema}, which this specview cannot read (it reads "
                            f"{KNOWN[family]}): render it with the specview version that wrote it, or record it again")
    _check_shape(path, doc)
    return path, doc


def newest_profile(folder: str) -> str:
    found = [p for p in glob.glob(os.path.join(folder, "*.json"))
             if not p.endswith((".trace.json", ".speedscope.json")) and not os.path.basename(p).startswith(".tmp-")]
    if not found:
        raise SpecviewError(f"no profile files in the folder {folder}")
    return max(found, key=os.path.getmtime)


def _bad_json(path: str, text: str, err: json.JSONDecodeError) -> str:
    first = text.lstrip().split("\n", 1)[0]
    try:
        if json.loads(first).get("type") == "start":
            return (f"{path} is a `--jsonl` event stream, not a profile: record one with "
                    "`specview run --profile`")
    except (json.JSONDecodeError, AttributeError):
        pass
    if err.pos >= len(text.rstrip()):
        return f"{path} is truncated: its JSON ends early (line {err.lineno}); the file was cut off while written"
    return f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"


def _profile_beside(path: str) -> str:
    """The profile a side file belongs to: X.json for X.trace.json, X.ops.trace.json,
    X.speedscope.json and X.py-spy.speedscope.json (longest suffix first: X.py-spy.speedscope.json
    is not the speedscope file of an `X.py-spy` profile)."""
    for suffix in (".py-spy.speedscope.json", ".ops.trace.json", ".speedscope.json", ".trace.json"):
        if path.endswith(suffix):
            profile = path[: -len(suffix)] + ".json"
            if os.path.isfile(profile):
                return f"the profile it belongs to is `specview report {profile}`"
            return f"`specview report` reads the profile beside it, {os.path.basename(profile)}, which is not there"
    return "`specview report` reads the profile beside it (<stem>.json)"


def _check_shape(path: str, doc: dict) -> None:
    def need(obj, key, kind, where):
        if not isinstance(obj.get(key), kind):
            raise SpecviewError(f"{path} is a damaged {doc['schema']} file: {where}{key} is missing or not "
                                f"{'an object' if kind is dict else 'a list' if kind is list else 'a number'}")

    if doc["schema"] == PROFILE_SCHEMA:
        need(doc, "meta", dict, "")
        need(doc, "summary", dict, "")
        need(doc, "steps", list, "")
        summary = doc["summary"]
        need(summary, "phases_ms", dict, "summary.")
        need(summary, "wall_ms", (int, float), "summary.")
        need(summary, "steps", int, "summary.")
    elif doc["schema"] == EVAL_SCHEMA:
        for key, kind in (("config", dict), ("prompts", list), ("results", list), ("summary", dict)):
            need(doc, key, kind, "")
    else:
        if not isinstance(doc.get("methods"), dict) and not isinstance(doc.get("sweep"), list):
            raise SpecviewError(f"{path} is a damaged {doc['schema']} file: it has neither \"methods\" nor \"sweep\"")
