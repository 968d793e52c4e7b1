"""The files `specview report` and `specview eval --resume` read, damaged every way a file gets damaged: cut off
while written, bytes that are not UTF-8, a folder, JSON of another shape, and real documents (a profile, a
bench file and an eval file written by specview on tiny models) with values replaced by the wrong type, huge
numbers, NaN or nothing, or keys removed. For each: the report renders (exit 0), or one line and exit 2; a
resume refuses the file before any model loads; nothing is written over the file."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os

import pytest
from fuzz_settings import fuzz
from hypothesis import given
from hypothesis import strategies as st

from specview.cli.main import main
from specview.cli.report import build_report_parser, report_command
from specview.core.errors import SpecviewError
from specview.core.file_schemas import newest_profile
from specview.eval.document import load_resume

HOSTILE = [None, True, False, 0, -1, 10**30, -(10**30), 10**400, 1e308, -1e308, math.nan, math.inf, -math.inf, 0.5, "",
           "x", "\u202e", [], [None], [1, "a"], {}, {"a": None}]


def quiet_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def documents(gpt2_paths, tmp_path_factory):
    """A real profile, bench file and eval file of the tiny pair, and the eval's command line."""
    folder = tmp_path_factory.mktemp("documents")
    target, draft = gpt2_paths
    pair = ["--target", target, "--draft", f"{draft},ngram", "-N", "6", "-K", "2", "--ignore-eos", "--threads", "1"]
    code, _, err = quiet_main(["run", *pair[:3], draft, *pair[4:], "--profile-dir", str(folder / "p"), "-q"])
    assert code == 0, err
    profile = newest_profile(str(folder / "p"))
    code, _, err = quiet_main(["bench", *pair, "--num-runs", "1", "--json", str(folder / "bench.json"),
                               "--no-profile"])
    assert code == 0, err
    prompts = folder / "set.jsonl"
    prompts.write_text('{"prompt": "w1 w2", "category": "a"}\n{"prompt": "w3 w4 w5", "category": "b"}\n')
    eval_argv = ["eval", *pair, "--prompts", str(prompts), "--no-plots"]
    code, _, err = quiet_main([*eval_argv, "--json", str(folder / "eval.json")])
    assert code == 0, err
    docs = {}
    for name, path in (("profile", profile), ("bench", str(folder / "bench.json")), ("eval", str(folder / "eval.json"))):
        with open(path, encoding="utf-8") as f:
            docs[name] = trimmed(json.load(f))
    return docs, eval_argv


def trimmed(doc):
    """The document with every list cut to its first 3 items (a profile's steps and rows are long): small
    enough for hypothesis to copy and shrink, still a document specview renders (test_a_good_document_renders)."""
    if isinstance(doc, dict):
        return {key: trimmed(value) for key, value in doc.items()}
    if isinstance(doc, list):
        return [trimmed(value) for value in doc[:3]]
    return doc


def paths_of(doc, prefix=()):
    """Every (path, value) in a JSON document, containers included."""
    yield prefix, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from paths_of(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:4]):  # the first few of a long list are enough
            yield from paths_of(value, (*prefix, i))


@st.composite
def damaged(draw, doc):
    """`doc` with 1..3 of its values replaced (or removed, or a list cut)."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        places = [p for p, _ in paths_of(doc) if p]
        if not places:
            break
        path = draw(st.sampled_from(places))
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "replace", "remove", "truncate"]))
        value = parent[path[-1]]
        if action == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "truncate" and isinstance(value, (list, str)):
            parent[path[-1]] = value[: draw(st.integers(0, max(len(value) - 1, 0)))]
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))  # a shared [] could end up inside itself
    return doc


def write(path, doc) -> bytes:
    data = json.dumps(doc, allow_nan=True).encode()  # NaN and Infinity as Python writes them
    path.write_bytes(data)
    return data


def report_or_one_line(*paths: str) -> str:
    """Render (in process): the output, or '' after a one-line SpecviewError; anything else fails."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            report_command(build_report_parser().parse_args(list(paths)))
    except SpecviewError as err:
        assert str(err) and "\n" not in str(err), str(err)
        return ""
    return out.getvalue()


@pytest.mark.parametrize("kind", ["profile", "bench", "eval"])
def test_a_good_document_renders(documents, tmp_path, kind):
    path = tmp_path / f"{kind}.json"
    write(path, documents[0][kind])
    assert report_or_one_line(str(path))


@pytest.mark.parametrize("kind", ["profile", "bench", "eval"])
def test_any_damaged_document_renders_or_is_one_line(documents, tmp_path_factory, kind):
    doc = documents[0][kind]
    folder = tmp_path_factory.mktemp(f"damaged-{kind}")

    @fuzz(60, 2000)
    @given(bad=damaged(doc), compare=st.booleans())
    def one(bad, compare):
        path = folder / "bad.json"
        data = write(path, bad)
        good = folder / "good.json"
        write(good, doc)
        report_or_one_line(str(path), str(good)) if compare else report_or_one_line(str(path))
        assert path.read_bytes() == data  # read, never written

    one()


@pytest.mark.parametrize("kind", ["profile", "bench", "eval"])
def test_any_cut_or_corrupted_file_is_one_line(documents, tmp_path_factory, kind):
    data = json.dumps(documents[0][kind], indent=1).encode()
    folder = tmp_path_factory.mktemp(f"cut-{kind}")

    @fuzz(40, 1000)
    @given(cut=st.integers(0, len(data) - 1), junk=st.binary(max_size=8), at=st.integers(0, len(data)))
    def one(cut, junk, at):
        path = folder / "bad.json"
        path.write_bytes(data[:cut])
        assert report_or_one_line(str(path)) == ""  # a cut JSON document never parses
        path.write_bytes(data[:at] + junk + data[at:])
        report_or_one_line(str(path))

    one()


@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00{", b"\xef\xbb\xbf{}", b"[]", b"null", b"1e999",
                                     b'{"schema": "specview.profile/1"}', b'{"schema": "specview.profile/2"}',
                                     b'{"schema": 7}', b'{"schema": "specview.eval/1", "config": []}',
                                     b'{"traceEvents": []}', b'{"schema": "specview.bench/1", "methods": {}}',
                                     b'{"schema": "specview.bench/1", "sweep": [{}]}', b"[" * 100_000,
                                     b'{"type": "start"}\n{"type": "step"}\n'])
def test_foreign_files_are_one_line(tmp_path, content):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    report_or_one_line(str(path))


def test_folders_are_one_line(tmp_path):
    assert report_or_one_line(str(tmp_path)) == ""  # no profile in it
    (tmp_path / "a.json").write_bytes(b"{")
    assert report_or_one_line(str(tmp_path)) == ""  # its newest is damaged
    os.mkdir(tmp_path / "sub.json")
    os.utime(tmp_path / "sub.json")
    assert report_or_one_line(str(tmp_path)) == ""  # its newest "profile" is a folder


# -- eval --resume -------------------------------------------------------------------------------------------


def resume_or_one_line(path: str, config: dict) -> dict | None:
    try:
        return load_resume(path, config)
    except SpecviewError as err:
        assert str(err) and "\n" not in str(err), str(err)
        return None


def test_any_damaged_resume_file_is_refused_before_the_models_load_or_resumes(documents, tmp_path_factory):
    from specview.eval.document import complete_results
    from specview.eval.summary import summarize

    doc = documents[0]["eval"]
    folder = tmp_path_factory.mktemp("resume")

    @fuzz(80, 2000)
    @given(bad=damaged(doc))
    def one(bad):
        path = folder / "eval.json"
        data = write(path, bad)
        kept = resume_or_one_line(str(path), doc["config"])
        if kept is not None:  # accepted: what the eval then does with it must work
            results = complete_results(kept, {p["id"] for p in doc["prompts"]})
            summarize({**doc, "results": results})
        assert path.read_bytes() == data

    one()


def test_a_damaged_resume_file_exits_2_and_is_not_written(documents, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("models loaded before the resume file was checked")

    monkeypatch.setattr("specview.session.open_session", refuse)
    doc, argv = documents
    bad = json.loads(json.dumps(doc["eval"]))
    bad["results"][0]["tokens"] = "many"
    path = tmp_path / "eval.json"
    data = write(path, bad)
    code, _, err = quiet_main([*argv, "--resume", str(path)])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert path.read_bytes() == data


# Integers past any float (10**400): math.isfinite() raised OverflowError in the resume check, a count passed it and
# broke the summary only after the models had loaded and the prompts had run; a profile's K of 10**19 made report
# build a search list of 2 * 10**19 K (killed for memory).
@pytest.mark.parametrize("where", [("results", 0, "wall_s"), ("results", 1, "phases_ms", "verify"),
                                   ("results", 0, "tokens"), ("results", 1, "accepted"), ("config", "k")])
def test_a_number_past_a_float_in_a_resume_file_exits_2_before_the_models_load(documents, tmp_path, monkeypatch,
                                                                               where):
    def refuse(*args, **kwargs):
        raise AssertionError("models loaded for a resume file the eval cannot use")

    monkeypatch.setattr("specview.session.open_session", refuse)
    doc, argv = documents
    bad = json.loads(json.dumps(doc["eval"]))
    parent = bad
    for part in where[:-1]:
        parent = parent[part]
    parent[where[-1]] = 10**400
    path = tmp_path / "eval.json"
    data = write(path, bad)
    code, _, err = quiet_main([*argv, "--resume", str(path)])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert path.read_bytes() == data


@pytest.mark.parametrize("k", [10**19, 10**400], ids=["10**19", "10**400"])
def test_a_huge_k_in_a_profile_renders_or_is_one_line(documents, tmp_path, k):
    bad = json.loads(json.dumps(documents[0]["profile"]))
    bad["meta"]["k"] = k
    path = tmp_path / "profile.json"
    data = write(path, bad)
    code, _, err = quiet_main(["report", str(path)])
    assert code in (0, 2) and "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    assert path.read_bytes() == data
