"""`specview report FILE [OTHER]`: render a profile (schema specview.profile/1), a bench file
(specview.bench/1) or an eval file (specview.eval/1) with rich; with two files of one kind, compare them.
Each kind owns its rendering (profiling.render, bench.tables, eval.tables); this module loads, checks and
dispatches.

A file that is not one of these (missing, empty, truncated, foreign JSON, another schema version)
raises SpecviewError with one line saying what it is instead; the CLI prints it and exits 2.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os

from rich.console import Console
from rich.text import Text

from specview.bench.schema import BENCH_SCHEMA
from specview.bench.tables import compare_bench, render_bench
from specview.errors import SpecviewError
from specview.eval.document import EVAL_SCHEMA
from specview.eval.tables import compare_evals, render_eval
from specview.options import Parser
from specview.profiling.profile import PROFILE_SCHEMA
from specview.profiling.render import compare_profiles, render_profile

KNOWN = {"specview.profile": PROFILE_SCHEMA, "specview.bench": BENCH_SCHEMA, "specview.eval": EVAL_SCHEMA}
RENDER = {PROFILE_SCHEMA: render_profile, BENCH_SCHEMA: render_bench, EVAL_SCHEMA: render_eval}
COMPARE = {PROFILE_SCHEMA: compare_profiles, BENCH_SCHEMA: compare_bench, EVAL_SCHEMA: compare_evals}


def render(path: str, doc: dict):
    return RENDER[doc["schema"]](path, doc)


def build_report_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="specview report",
        description="Render a profile (from `run --profile`, the TUI or bench) or a bench file; "
                    "with two files, compare them side by side.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="FILE may be a folder: its newest profile is shown. The .trace.json beside a profile opens "
               "in https://ui.perfetto.dev, the .speedscope.json in https://www.speedscope.app.",
    )
    p.add_argument("file", metavar="FILE", help="a profile .json or a bench .json (or a folder of profiles)")
    p.add_argument("other", metavar="OTHER", nargs="?", help="a second file to compare with the first")
    return p


def report_command(args) -> int:
    first = load(args.file)
    second = load(args.other) if args.other else None
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    try:
        with console.capture() as page:  # the whole page first: a damaged file prints nothing but its error
            if second is None:
                console.print(render(*first))
            elif first[1]["schema"] == second[1]["schema"]:
                console.print(COMPARE[first[1]["schema"]](first, second))
            else:
                console.print(Text("two kinds of file: shown one after the other", style="dim"))
                console.print(render(*first))
                console.print(render(*second))
    except DAMAGE as err:
        raise SpecviewError(_damaged(first, second, err)) from None
    console.file.write(page.get())
    return 0


# What rendering a file with a value missing or of the wrong type raises (the loader checks the outline only).
DAMAGE = (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError,
          RecursionError)


def _damaged(first: tuple[str, dict], second: tuple[str, dict] | None, err: Exception) -> str:
    """Name the file that cannot be rendered: each alone, then the pair."""
    reason = f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"
    for path, doc in filter(None, (first, second)):
        try:
            with Console(file=io.StringIO(), width=120).capture():
                render(path, doc)
        except DAMAGE as alone:
            reason = f"{type(alone).__name__}: {' '.join(str(alone).split())[:120]}"
            return (f"{path} is a damaged {doc['schema']} file: a value is missing or of the wrong type ({reason}); "
                    "was it edited by hand?")
    return (f"{first[0]} and {second[0]} cannot be compared: a value is missing or of the wrong type in one of "
            f"them ({reason})")




# --- loading ---------------------------------------------------------------------------------------


def load(path: str) -> tuple[str, dict]:
    """-> (path, document) of a profile or bench file, or SpecviewError saying what is wrong in one line."""
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


# --- formatting ------------------------------------------------------------------------------------
