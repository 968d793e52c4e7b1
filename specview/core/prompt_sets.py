"""Prompt sets for `specview eval` (docs/design/bench-and-eval.md "Eval"): the builtin set, a Spec-Bench question.jsonl as
is, a JSONL of {"prompt", "category"}, or a text file with one prompt per line. No torch: every problem
with a prompt file is one line (SpecviewError, exit 2) before any model loads.

A file ending in .jsonl, .json or .ndjson is read as JSON lines (each line either Spec-Bench's
{"question_id", "category", "turns"}, whose first turn is the prompt, or {"prompt", "category"}, with an
optional "id"); any other file is plain text, one prompt per line, category "default".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib.resources import files

from specview.core.errors import SpecviewError
from specview.core.prompt_text import text_problem

BUILTIN = "builtin"
DEFAULT_CATEGORY = "default"
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


@dataclass(frozen=True)
class Prompt:
    id: str  # unique in the set: resume matches results to prompts by it
    category: str
    text: str


def load_prompts(source: str, limit: int | None = None, categories: list[str] | None = None) -> list[Prompt]:
    """The prompts of `source` (BUILTIN or a file path), filtered: only `categories` (in the set's order),
    at most `limit` per category (the first ones)."""
    if source == BUILTIN:
        text = files("specview.core").joinpath("builtin_prompts.jsonl").read_text(encoding="utf-8")
        prompts = parse_jsonl(text, "the builtin set")
    else:
        text = read_text(source)
        prompts = parse_jsonl(text, source) if source.lower().endswith(JSONL_SUFFIXES) else parse_lines(text)
    if not prompts:
        raise SpecviewError(f"--prompts {source}: no prompts in the file (only blank lines)")
    return select(prompts, limit, categories)


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise SpecviewError(f"--prompts: cannot read {path}: no such file") from None
    except IsADirectoryError:
        raise SpecviewError(f"--prompts: cannot read {path}: a folder, not a prompt file") from None
    except OSError as err:
        raise SpecviewError(f"--prompts: cannot read {path}: {err.strerror}") from err
    if not raw.strip():
        raise SpecviewError(f"--prompts: {path} is empty")
    try:
        return raw.decode("utf-8-sig")  # a BOM from a Windows editor is not part of the first prompt
    except UnicodeDecodeError:
        raise SpecviewError(f"--prompts: {path} is not a UTF-8 text file") from None


def parse_lines(text: str) -> list[Prompt]:
    """One prompt per non-blank line; the id is the line number (1-based), so it stays put when a
    line is added at the end and --resume still matches."""
    return [Prompt(str(n), DEFAULT_CATEGORY, line.strip())
            for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def parse_jsonl(text: str, where: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        prompt = parse_record(line, f"{where} line {n}", n)
        if prompt.id in seen:
            raise SpecviewError(f"{where} line {n}: id {prompt.id!r} is already used on line {seen[prompt.id]}")
        seen[prompt.id] = n
        prompts.append(prompt)
    return prompts


def parse_record(line: str, where: str, n: int) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise SpecviewError(f"{where}: not JSON ({err.msg} at column {err.colno})") from None
    except (RecursionError, ValueError):  # [[[[...: past the parser's stack; a number of over 4300 digits
        raise SpecviewError(f"{where}: not JSON specview reads (nested too deeply, or a number too long)") from None
    if not isinstance(record, dict):
        raise SpecviewError(f"{where}: a JSON {json_kind(record)}, not an object with \"prompt\" or \"turns\"")
    if "turns" in record:  # Spec-Bench: the first turn is the prompt (later turns need the model's answers)
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise SpecviewError(f"{where}: \"turns\" must be a non-empty list of strings")
        text = turns[0]
    elif "prompt" in record:
        text = record["prompt"]
        if not isinstance(text, str):
            raise SpecviewError(f"{where}: \"prompt\" must be a string")
    else:
        raise SpecviewError(f"{where}: no \"prompt\" or \"turns\" field")
    if not text.strip():
        raise SpecviewError(f"{where}: the prompt is empty")
    category = record.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise SpecviewError(f"{where}: \"category\" must be a non-empty string")
    ident = record.get("question_id", record.get("id", n))
    if not isinstance(ident, (str, int)) or isinstance(ident, bool):
        raise SpecviewError(f"{where}: the id must be a string or an integer")
    for name, value in (("the prompt", text), ("the category", category), ("the id", str(ident))):
        problem = text_problem(value)  # a "\ud800" escape: the tokenizer and the tables would fail on it
        if problem:
            raise SpecviewError(f"{where}: {name} is not text: {problem}")
    return Prompt(str(ident), category.strip(), text)


def json_kind(value) -> str:
    """What a JSON line held instead of an object: "null" for null (not Python's "NoneType"), else its type."""
    return "null" if value is None else type(value).__name__


def select(prompts: list[Prompt], limit: int | None, categories: list[str] | None) -> list[Prompt]:
    present = list(dict.fromkeys(p.category for p in prompts))
    if categories:
        unknown = [c for c in categories if c not in present]
        if unknown:
            raise SpecviewError(f"--categories: unknown category {unknown[0]!r}; this set has {', '.join(present)}")
        prompts = [p for p in prompts if p.category in categories]
    if limit is not None:
        taken: dict[str, int] = {}
        kept = []
        for p in prompts:
            taken[p.category] = taken.get(p.category, 0) + 1
            if taken[p.category] <= limit:
                kept.append(p)
        prompts = kept
    return prompts


def parse_categories(text: str) -> list[str]:
    """--categories 'qa, math' -> ['qa', 'math'] (argparse type: a bad list is a usage error)."""
    import argparse

    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"--categories needs a comma-separated list like qa,math, got {text!r}")
    return list(dict.fromkeys(parts))


def digest(prompts: list[Prompt]) -> str:
    """sha256 of the selected prompts (ids, categories, texts): --resume refuses results of another set."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.id, p.category, p.text], ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()
