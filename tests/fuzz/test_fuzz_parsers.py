"""Property tests of the parsers a user's text reaches: `--draft` specs (core/draft_spec.py, ngram options,
self:skip sets, models.parse_spec), `--device-map` (auto or a JSON file) and `--max-memory`, and the prompt-set
readers of eval and check (text, JSONL, Spec-Bench question.jsonl). For any input each one returns a value
that makes sense, or raises SpecviewError with one line; never another exception, and never a hang.
In process (fast); test_fuzz_cli.py runs a few of the same through a real `specview` process."""

from __future__ import annotations

import json
import string

import pytest
from fuzz_settings import fuzz
from hypothesis import example, given
from hypothesis import strategies as st

from specview.core.draft_spec import parse_drafts
from specview.core.errors import SpecviewError
from specview.core.prompt_sets import load_prompts, parse_jsonl, parse_lines
from specview.core.prompt_text import text_problem
from specview.drafters.layerskip import parse_skip
from specview.drafters.ngram import parse_ngram_options
from specview.models.loader import parse_spec
from specview.models.placement import parse_max_memory, placement

LAYERS = 6  # the skip sets are checked against a model of this many decoder layers


def one_line_error(call, *args):
    """call(*args) -> its value, or None when it raised SpecviewError with a one-line message."""
    try:
        return call(*args)
    except SpecviewError as err:
        message = str(err)
        assert message and "\n" not in message and "Traceback" not in message, message
        assert len(message) < 2000, message[:200]  # a huge input is quoted cut short
        return None


def check_draft(text: str) -> list | None:
    """What a session does with --draft before and while building the drafters, without models."""
    def run():
        out = []
        for parsed in parse_drafts(text):  # (a ";tree..." suffix is checked here)
            what, spec = parsed.kind, parsed.base
            if what == "ngram":
                out.append(parse_ngram_options(spec))
            elif what == "self":
                options = spec.partition(":")[2]
                if options != "auto":
                    if not options.startswith("skip="):
                        raise SpecviewError("use self:skip=LAYERS or self:auto")
                    out.append(parse_skip(options.removeprefix("skip="), LAYERS))
            else:
                out.append(parse_spec(spec))
        return out
    return one_line_error(run)


# -- --draft ---------------------------------------------------------------------------------------------------

number = st.one_of(st.integers(-3, 12).map(str), st.sampled_from(["", "x", "1.5", "+2", " 3", "٣", "²", "1" * 5000,
                                                                   "99999999999999", "-0", "0x10"]))
ngram = st.builds(lambda opts: "ngram" + (":" + ",".join(opts) if opts else ""),
                  st.lists(st.one_of(st.builds("max={}".format, number), st.builds("min={}".format, number),
                                     st.text(string.ascii_lowercase + "=,:", max_size=8)), max_size=3))
layer_range = st.one_of(number, st.builds("{}-{}".format, number, number))
skip = st.builds(lambda items: "self:skip=" + ",".join(items), st.lists(layer_range, max_size=4))
model = st.builds("{}{}".format, st.sampled_from(["gpt2", "./nowhere", "/no/such/dir", "~/x", "a.gguf", "org/model",
                                                  "", "smollm2-135m", "x\x00y", "\udcff"]),
                  st.sampled_from(["", "@float32", "@bfloat16", "@int4", "@int4+head", "@int8", "@", "@@",
                                   "@float32@int4"]))
# the token-tree grammar after ';': MODEL;tree, MODEL;tree:b=2,d=4, MODEL;tree:nodes=N
tree_option = st.one_of(*(st.builds((key + "={}").format, number) for key in ("b", "d", "nodes")),
                        st.text(string.ascii_lowercase + "=,:;", max_size=6))
tree = st.builds(lambda base, opts: base + ";tree" + ("" if opts is None else ":" + ",".join(opts)),
                 st.one_of(model, ngram, st.just("self:auto")), st.none() | st.lists(tree_option, max_size=3))
spec_item = st.one_of(ngram, skip, model, tree, st.just("self:auto"), st.just("self:"), st.just("magic:x=1"),
                      st.text(max_size=12))


@fuzz(300, 5000)
@given(st.lists(spec_item, min_size=1, max_size=4).map(",".join) | st.text(max_size=40))
@example("self:skip=0-999999999999")  # found: the set was expanded before its range was checked (a hang)
@example("self:skip=" + "1" * 5000)  # found: int() over 4300 digits raised ValueError
@example("ngram:max=1" + "0" * 5000)  # a 10,000-character message: quoted cut short now
@example("@\n0")  # found: a newline quoted as is split the one line
@example("~\x00")  # found by make fuzz: os.path.expanduser raised ValueError (embedded null byte)
@example("gpt2;tree:b=²")  # found: isdigit() took it, int() raised ValueError
@example("gpt2;tree:nodes=" + "1" * 5000)  # found: int() over 4300 digits raised ValueError
def test_any_draft_spec_parses_or_is_one_line(text):
    out = check_draft(text)
    if out is not None:
        for value in out:
            if isinstance(value, tuple) and value and isinstance(value[0], int) and len(value) != 2:
                assert all(0 <= i < LAYERS for i in value) and len(value) < LAYERS  # a skip set


@pytest.mark.timeout(20)  # the regression: 0-10**12 built a set of 10**12 layers
def test_a_huge_skip_range_is_refused_at_once():
    with pytest.raises(SpecviewError, match="out of range"):
        parse_skip("0-999999999999", LAYERS)
    with pytest.raises(SpecviewError, match="out of range"):
        parse_skip("99", LAYERS)  # a range wholly past the model names the layer, not "empty"


def test_ngram_and_skip_specs_mean_what_they_say():
    # found: the README's own self:skip=4-9,15 split into self:skip=4-9 and a model named "15"
    assert check_draft("ngram:max=3,min=2,self:skip=1-2,4,ngram:min=2") == [(3, 2), (1, 2, 4), (4, 2)]
    assert [d.text for d in parse_drafts("self:skip=4-9,15")] == ["self:skip=4-9,15"]
    assert one_line_error(check_draft, "ngram:min=3,max=2") is None


# -- --device-map and --max-memory -----------------------------------------------------------------------------

size = st.one_of(st.builds("{}{}".format, st.one_of(st.integers(0, 10**6).map(str), st.sampled_from(
    ["1.5", ".5", "1.", "-5", "1e400", "9" * 400, "nan", "inf", ""])), st.sampled_from(
    ["GiB", "MiB", "KiB", "GB", "MB", "KB", "TB", "TiB", "gib", "B", "", "XB", " GiB", "G"])), st.text(max_size=6))
device = st.one_of(st.sampled_from(["cpu", "disk", "mps", "0", "1", "7", "cuda", "cuda:0", "gpu", "", "²", "-1"]),
                   st.text(max_size=4))


@fuzz(300, 5000)
@given(st.lists(st.builds("{}={}".format, device, size) | st.text(max_size=10), max_size=4).map(",".join))
@example("cpu=" + "9" * 5000 + "GB")  # found: float() overflowed to inf, int(inf) raised OverflowError
@example("0=20GiB")  # found (at load): no GPU here, torch raised RuntimeError
def test_any_max_memory_parses_or_is_one_line(text):
    out = one_line_error(placement, "auto", text)
    if out is not None and "max_memory" in out:
        for dev, value in out["max_memory"].items():
            assert dev in ("cpu", "disk") or isinstance(dev, int), dev
            assert (isinstance(value, int) and value >= 0) or (isinstance(value, str) and value[-1] == "B"), value


def test_max_memory_sizes():
    assert parse_max_memory("cpu=1TB, disk=1024") == {"cpu": 10**12, "disk": 1024}
    assert parse_max_memory("cpu=60GiB") == {"cpu": "60GiB"}  # accelerate's spelling passes as is
    for bad in ("cpu=abc", "cpu=-5GB", "gpu=1GB", "cpu=1e400GB", "cpu=20XB", "=,="):
        assert one_line_error(parse_max_memory, bad) is None, bad


json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=8)
device_value = st.one_of(st.sampled_from(["cpu", "disk", "meta", "mps", "cuda", "cuda:0", "cuda:1", "gpu7", "cpu:0",
                                          "", "xla"]), st.integers(-2, 3), st.floats(), st.booleans(), st.none(),
                         json_value)


@fuzz(150, 3000)
@given(content=st.one_of(st.dictionaries(st.sampled_from(["", "model", "lm_head", "model.layers.0", "x"]),
                                         device_value, max_size=3).map(json.dumps).map(str.encode),
                         json_value.map(lambda v: json.dumps(v).encode()), st.binary(max_size=40)))
@example(content=b"[" * 100_000)  # found: RecursionError
@example(content=json.dumps({"": "gpu7"}).encode())  # found (at load): torch's RuntimeError
@example(content=json.dumps({"": None}).encode())  # found (at load): torch's TypeError
@example(content=json.dumps({"": "cuda:0"}).encode())  # found (at load): AssertionError, no CUDA here
@example(content=json.dumps({"": 128}).encode())  # found: torch.device("cuda", 128) is cuda:-128, it passed the check
@example(content=b"\xff\xfe{}")
def test_any_device_map_file_is_a_placement_or_one_line(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("map") / "map.json"
    path.write_bytes(content)
    out = one_line_error(placement, str(path))
    if out is not None:
        mapping = out["device_map"]
        assert isinstance(mapping, dict) and mapping
        for where in mapping.values():  # only devices this machine has (a CPU-only machine: cpu and disk)
            assert where == "disk" or str(where).startswith("cpu"), where


def test_a_device_map_that_is_a_folder_or_missing_is_one_line(tmp_path):
    assert one_line_error(placement, str(tmp_path)) is None
    assert one_line_error(placement, str(tmp_path / "missing.json")) is None


# -- prompt sets ---------------------------------------------------------------------------------------------

record = st.fixed_dictionaries({}, optional={
    "prompt": st.one_of(st.text(max_size=12), json_value), "category": st.one_of(st.text(max_size=6), json_value),
    "turns": st.one_of(st.lists(st.text(max_size=8), max_size=2), json_value), "question_id": json_value,
    "id": json_value, "extra": json_value})
jsonl_line = st.one_of(record.map(json.dumps), json_value.map(json.dumps), st.text(max_size=20),
                       st.sampled_from(['{"prompt": "\\ud800"}', '{"prompt": "w1", "category": "\\udc80"}',
                                        '{"turns": ["\\udfff x"]}', '{"prompt": "a", "id": "\\ud83d"}']))


def check_prompts(prompts) -> None:
    assert prompts, "no prompts, and no error either"
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.text.strip() and p.category.strip()
        assert text_problem(p.text) is None and text_problem(p.category) is None and text_problem(p.id) is None


@fuzz(300, 5000)
@given(st.lists(jsonl_line, max_size=5).map("\n".join))
@example('{"prompt": "\\u0000\\ud800 x"}')  # found: a lone surrogate reached the tokenizer (TypeError mid-eval)
@example('{"prompt": "w1", "category": "\\udc80"}')  # found: ... and the tables (UnicodeEncodeError)
def test_any_jsonl_prompt_set_is_prompts_or_one_line(text):
    out = one_line_error(parse_jsonl, text, "set.jsonl")
    if out:
        check_prompts(out)


@fuzz(200, 3000)
@given(st.text())
def test_any_text_prompt_file_is_prompts(text):
    prompts = parse_lines(text)
    assert all(p.text == p.text.strip() and p.text for p in prompts)


@fuzz(150, 3000)
@given(content=st.one_of(st.binary(max_size=60), st.lists(jsonl_line, max_size=4).map("\n".join).map(str.encode),
                         st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass"))),
       suffix=st.sampled_from([".txt", ".jsonl", ".json", ".ndjson", ""]))
@example(content=b"\xef\xbb\xbfw1\n", suffix=".txt")
@example(content=b"\xed\xa0\x80 x\n", suffix=".txt")  # an encoded surrogate: not UTF-8
def test_any_prompt_file_is_prompts_or_one_line(tmp_path_factory, content, suffix):
    path = tmp_path_factory.mktemp("prompts") / f"set{suffix}"
    path.write_bytes(content)
    out = one_line_error(load_prompts, str(path))
    if out is not None:
        check_prompts(out)


def test_a_prompt_set_that_is_a_folder_or_missing_is_one_line(tmp_path):
    assert one_line_error(load_prompts, str(tmp_path)) is None
    assert one_line_error(load_prompts, str(tmp_path / "missing.jsonl")) is None


def test_spec_bench_questions_read_their_first_turn():
    line = json.dumps({"question_id": 81, "category": "writing", "turns": ["first", "second"]})
    (p,) = parse_jsonl(line, "question.jsonl")
    assert (p.id, p.category, p.text) == ("81", "writing", "first")


# -- --draft-policy ---------------------------------------------------------------------------------------------

policy = st.one_of(st.sampled_from(["fixed", "heuristic", "goodput", "p-min", "p-min=", "pmin:0.5", "tree", ""]),
                   st.builds("p-min={}".format, st.one_of(st.floats(allow_nan=True).map(str), number)),
                   st.text(max_size=10))


@fuzz(100, 3000)
@given(st.lists(policy, min_size=1, max_size=3).map(",".join))
@example("p-min=" + "9" * 5000)
@example("p-min=1e-400")
def test_any_draft_policy_list_parses_or_is_one_line(text):
    from specview.core.policies import parse_policies

    out = one_line_error(parse_policies, text)
    if out is not None:
        assert out and len(out) == len(set(out)) and all(isinstance(p, str) and p for p in out)
