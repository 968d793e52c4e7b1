"""The converted-weights cache (specview/gguf_cache.py): the cache layer on a tiny save_pretrained
model, then the whole GGUF path through load_model on a tiny GGUF written with the `gguf` package.
Every test gets its own cache dir (SPECVIEW_CACHE_DIR = a tmp_path): the user's cache is never touched."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import tiny
from specview.core.files import ORPHAN_AGE_S
from specview.models import gguf_cache
from specview.models.gguf_cache import MARKER, cached_load, entry_path, entry_problem
from specview.models.loader import load_model
from tiny import write_tiny_gguf


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(root))
    return root


class Counter:
    """build / save / load for cached_load on a tiny Llama, counting the builds."""

    def __init__(self, seed=0):
        self.builds = 0
        self.seed = seed

    def build(self):
        self.builds += 1
        return tiny.make_model("llama", 16, self.seed), tiny.make_tokenizer(16)

    @staticmethod
    def save(obj, folder):
        tiny.save(*obj, folder)

    @staticmethod
    def load(folder):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), AutoTokenizer.from_pretrained(folder)

    def __call__(self, key=None):
        return cached_load(key or {"source_sha256": "abc"}, self.build, self.save, self.load, name="tiny")


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    assert gguf_cache.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("SPECVIEW_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_cache.cache_dir() == tmp_path / "xdg" / "specview"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf_cache.cache_dir() == tmp_path / "home" / ".cache" / "specview"


def test_first_call_builds_and_writes_the_second_loads(cache_root):
    c = Counter()
    (model, _), how = c()
    assert (how, c.builds) == ("built", 1)
    entry = entry_path("tiny", {"source_sha256": "abc"})
    assert entry.parent == cache_root and entry_problem(entry) is None
    files = json.loads((entry / MARKER).read_text())["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    (again, tok), how = c()
    assert (how, c.builds) == ("hit", 1)  # build not called
    assert same_weights(model, again) and tok("w1 w2")["input_ids"] == [4, 5]
    # no temp folder left behind (the conversion's lock file stays: removing a held flock's file would let two hold it)
    assert [p.name for p in cache_root.iterdir() if p.suffix != ".lock"] == [entry.name]


@pytest.mark.parametrize("damage", ["truncate", "missing", "bad json", "no marker", "bad marker"])
def test_a_damaged_entry_is_rebuilt(damage):
    c = Counter()
    c()
    entry = entry_path("tiny", {"source_sha256": "abc"})
    if damage == "truncate":
        path = entry / "model.safetensors"
        os.truncate(path, path.stat().st_size // 2)
    elif damage == "missing":
        (entry / "config.json").unlink()
    elif damage == "bad json":  # same size, so only parsing it tells
        size = (entry / "config.json").stat().st_size
        (entry / "config.json").write_text("{" * size)
    elif damage == "no marker":
        (entry / MARKER).unlink()
    else:
        (entry / MARKER).write_text("{not json")
    assert entry_problem(entry) is not None
    (model, _), how = c()
    assert (how, c.builds) == ("built", 2)
    assert entry_problem(entry) is None
    assert c()[1] == "hit" and c.builds == 2


def test_a_safetensors_header_that_lies_is_caught(tmp_path):
    c = Counter()
    c()
    path = entry_path("tiny", {"source_sha256": "abc"}) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[:8] = (len(data) * 2).to_bytes(8, "little")  # header length past the end, file size unchanged
    path.write_bytes(bytes(data))
    assert "past the end" in entry_problem(path.parent)
    assert c()[1] == "built"


def test_an_entry_that_fails_to_load_is_rebuilt():
    c = Counter()
    c()
    calls = []

    def bad_load(folder):
        calls.append(folder)
        raise RuntimeError("boom")

    obj, how = cached_load({"source_sha256": "abc"}, c.build, c.save, bad_load, name="tiny")
    assert how == "built" and len(calls) == 1 and c.builds == 2


def test_a_leftover_temp_folder_is_ignored_and_a_stale_one_removed(cache_root):
    cache_root.mkdir(parents=True)
    entry = entry_path("tiny", {"source_sha256": "abc"})
    fresh = cache_root / f"{gguf_cache.TMP_PREFIX}{entry.name}-killed"  # an older specview's: no pid in the name
    stale = cache_root / f"{gguf_cache.TMP_PREFIX}{entry.name}-old"
    for folder in (fresh, stale):  # a build killed half way: some files, no marker
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"\0" * 10)
    old = time.time() - 2 * ORPHAN_AGE_S
    os.utime(stale, (old, old))
    c = Counter()
    assert c()[1] == "built" and c()[1] == "hit"
    assert fresh.exists() and not stale.exists()  # a fresh one may be another process's build in progress


def test_the_temp_folder_of_a_conversion_killed_mid_save_is_removed_by_the_next_start(cache_root):
    """A start killed while it saved the converted model leaves its temporary folder (the whole model's size): the
    next start removes it, even one that only loads, unless its process is alive (a conversion in flight)."""
    c = Counter()
    assert c()[1] == "built"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names no process now
    entry = entry_path("tiny", {"source_sha256": "abc"})
    killed = cache_root / f"{gguf_cache.TMP_PREFIX}{dead.pid}-{entry.name}-x1"
    alive = cache_root / f"{gguf_cache.TMP_PREFIX}{os.getpid()}-{entry.name}-x2"
    for folder in (killed, alive):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"\0" * 10)
    assert c()[1] == "hit"
    assert not killed.exists() and alive.exists()


def test_a_new_format_replaces_its_old_entry_and_leaves_other_versions_alone(cache_root):
    key = {"format": 1, "source_sha256": "abc", "torch": "2.13.0", "transformers": "5.23.0"}
    c = Counter()
    c(key)
    c({**key, "transformers": "5.24.0"})  # another environment sharing the cache
    c({**key, "source_sha256": "def"})  # another model
    old, other_version, other_model = (entry_path("tiny", k) for k in (
        key, {**key, "transformers": "5.24.0"}, {**key, "source_sha256": "def"}))
    c({**key, "format": 3})  # a newer specview sharing the cache
    (cache_root / "thin_kernels").mkdir()  # a build folder without a marker is not an entry
    c({**key, "format": 2})
    assert not old.exists()  # the same model at an older FORMAT: nothing reads it any more
    assert other_version.exists() and other_model.exists() and (cache_root / "thin_kernels").exists()
    assert entry_path("tiny", {**key, "format": 3}).exists()  # a newer FORMAT is not ours to remove
    assert entry_path("tiny", {**key, "format": 2}).exists() and c.builds == 5
    assert not [p for p in cache_root.iterdir() if p.name.startswith(".")]  # nothing left aside


def test_a_failed_write_still_returns_the_model(cache_root):
    cache_root.parent.mkdir(parents=True, exist_ok=True)
    cache_root.write_text("a file where the cache folder should be")
    c = Counter()
    (model, _), how = c()
    assert how == "built, not cached" and isinstance(model, torch.nn.Module)

    def failing_save(obj, folder):
        raise ValueError("not serializable")

    cache_root.unlink()
    obj, how = cached_load({"source_sha256": "abc"}, c.build, failing_save, c.load, name="tiny")
    assert how == "built, not cached"
    assert not [p for p in cache_root.iterdir() if p.suffix != ".lock"]  # the temp folder is gone, no entry was made


def test_the_key_follows_the_bytes_not_the_path(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + b"\1" * 100)
    b.write_bytes(b"GGUF" + b"\1" * 100)
    ka, kb = gguf_cache.gguf_key_inputs(a), gguf_cache.gguf_key_inputs(b)
    assert ka == kb and entry_path("m", ka) == entry_path("m", kb)
    assert ka["torch"] == torch.__version__ and "transformers" in ka
    b.write_bytes(b"GGUF" + b"\1" * 99 + b"\2")  # one byte differs
    kb = gguf_cache.gguf_key_inputs(b)
    assert kb["source_sha256"] != ka["source_sha256"] and entry_path("m", ka) != entry_path("m", kb)
    assert entry_path("m", ka) != entry_path("m", {**ka, "transformers": "0.0"})


# ---- the GGUF path end to end, on a tiny GGUF (a Llama, byte-level BPE tokenizer, float32 tensors)

@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def entries(root):
    """The converted-model entries (folders); the cache folder also keeps small per-machine figures
    (bandwidth.json, packed_linear.json) and the per-machine builds (the thin kernels' library, the compiled forwards'
    packages), which are not weights (a run builds the thin kernels there when no earlier test of the process did)."""
    builds = ("thin_kernels", "aot")
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in builds
                  ) if root.exists() else []


def test_gguf_load_goes_through_the_cache_and_matches_the_direct_load(tiny_gguf, cache_root):
    cpu = torch.device("cpu")
    direct = load_model(tiny_gguf, cpu, cache=False)
    assert entries(cache_root) == []  # --no-cache neither reads nor writes
    first = load_model(tiny_gguf, cpu)
    (entry,) = entries(cache_root)
    assert entry.name.startswith("tiny-") and entry_problem(entry) is None
    assert first.model.config.name_or_path != str(entry)  # built from the GGUF, not read back
    second = load_model(tiny_gguf + "@bfloat16", cpu)
    assert second.model.config.name_or_path == str(entry)  # read from the cache
    assert second.dtype == torch.bfloat16 and first.dtype == direct.dtype == torch.float32
    hit = load_model(tiny_gguf, cpu)
    for lm in (first, hit):
        assert same_weights(direct.model, lm.model)
        assert lm.context_len == direct.context_len == 256
        assert lm.tokenizer.get_vocab() == direct.tokenizer.get_vocab()
        assert lm.tokenizer.eos_token_id == direct.tokenizer.eos_token_id
        assert lm.tokenizer.added_tokens_decoder == direct.tokenizer.added_tokens_decoder
        assert lm.tokenizer.all_special_tokens == direct.tokenizer.all_special_tokens
        assert lm.model.generation_config.eos_token_id == direct.model.generation_config.eos_token_id
        text = "the theme <|im_start|>then"
        assert lm.tokenizer(text)["input_ids"] == direct.tokenizer(text)["input_ids"]
    ids = torch.tensor([[1, 2, 3, 257, 258]])
    with torch.no_grad():
        assert torch.equal(direct.model(ids).logits, hit.model(ids).logits)
    # the entry lists the added tokens, so a load need not parse tokenizer.json for them
    listed = json.loads((entry / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert {int(i): t["content"] for i, t in listed.items()} == {
        i: t.content for i, t in direct.tokenizer.added_tokens_decoder.items()}


def test_a_truncated_cached_gguf_model_is_rebuilt_not_a_crash(tiny_gguf, cache_root):
    cpu = torch.device("cpu")
    load_model(tiny_gguf, cpu)
    (entry,) = entries(cache_root)
    weights = entry / "model.safetensors"
    os.truncate(weights, 100)
    lm = load_model(tiny_gguf, cpu)
    assert lm.model.config.name_or_path != str(entry)  # rebuilt from the GGUF
    assert entry_problem(entry) is None and weights.stat().st_size > 100
    assert load_model(tiny_gguf, cpu).model.config.name_or_path == str(entry)


def test_the_cli_uses_the_cache_and_no_cache_skips_it(capsys, tiny_gguf, cache_root):
    from helpers import run_cli

    argv = ["run", "--target", tiny_gguf, "--draft", tiny_gguf + "@bfloat16", "--prompt", "the theme", "-N", "4",
            "--quiet"]
    code, out, err = run_cli(capsys, *argv, "--no-cache")
    assert code == 0 and entries(cache_root) == []
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and len(entries(cache_root)) == 1 and not err.strip()


def test_the_int4_copy_keeps_its_codes_in_the_cache_and_reads_back_the_same_copy(tiny_gguf, cache_root):
    """`@int4` of a cached GGUF: the first load quantizes and writes the codes beside the converted model, the
    next reads them (no quantize call) and builds the same copy; a damaged codes file is rebuilt; --no-cache
    neither reads nor writes them."""
    from specview.models import int4

    cpu = torch.device("cpu")
    uncached = load_model(tiny_gguf + "@int4", cpu, cache=False)
    assert entries(cache_root) == []
    first = load_model(tiny_gguf + "@int4", cpu)
    codes_entry = next(e for e in entries(cache_root) if "int4" in e.name)
    assert entry_problem(codes_entry) is None and (codes_entry / int4.CODES_FILE).is_file()

    calls = []
    real_quantize = int4.quantize
    int4.quantize = lambda *a, **k: calls.append(1) or real_quantize(*a, **k)
    try:
        hit = load_model(tiny_gguf + "@int4", cpu)
    finally:
        int4.quantize = real_quantize
    assert calls == []  # every matrix from the stored codes

    def linears(model):
        return {n: m for n, m in model.named_modules() if isinstance(m, int4.Int4Linear)}

    reference = linears(uncached.model)
    assert reference and "lm_head" not in reference  # (this tiny vocabulary of 261 has no 4-bit head)
    for lm in (first, hit):
        mine = linears(lm.model)
        assert mine.keys() == reference.keys()
        for name, module in mine.items():
            for attr in ("packed", "scales_and_zeros", "halves"):
                assert torch.equal(getattr(module, attr), getattr(reference[name], attr)), (name, attr)
    ids = torch.tensor([[1, 2, 3, 257, 258]])
    with torch.no_grad():
        assert torch.equal(uncached.model(ids).logits, hit.model(ids).logits)

    os.truncate(codes_entry / int4.CODES_FILE, 100)
    rebuilt = load_model(tiny_gguf + "@int4", cpu)
    assert entry_problem(codes_entry) is None
    assert all(torch.equal(m.packed, reference[n].packed) for n, m in linears(rebuilt.model).items())
    assert len([e for e in entries(cache_root) if "int4" in e.name]) == 1


def test_a_gguf_load_parses_the_file_once(tiny_gguf, monkeypatch):
    """transformers reads a GGUF three times (the tokenizer's config, the model's, the tensors); a first start
    parses it once (specview/models/gguf_read.py). The load's result is the direct load's (the test above)."""
    import gguf

    parses = []
    real = gguf.GGUFReader

    def counted(path, *args, **kwargs):
        parses.append(str(path))
        return real(path, *args, **kwargs)

    tables = []
    real_names = gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "GGUFReader", counted)
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *args: tables.append(args) or real_names(*args))
    lm = load_model(tiny_gguf, torch.device("cpu"), cache=False)
    assert parses == [tiny_gguf]
    assert len(tables) == 1  # the tensor-name table, once (not once per module)
    assert lm.tokenizer("the theme")["input_ids"] and lm.model.config.num_hidden_layers > 0
    assert gguf.GGUFReader is counted and gguf.get_tensor_name_map is not real_names  # the patches end with the load


CONVERTING = """
import sys
import tiny
from specview.models.gguf_cache import cached_load

def build():
    print("converting", flush=True)
    if sys.argv[1] == "first":
        sys.stdin.readline()  # held here until the test lets it go
    return tiny.make_model("llama", 16, 0), tiny.make_tokenizer(16)

_, how = cached_load({"source_sha256": "abc"}, build, lambda obj, folder: tiny.save(*obj, folder),
                     lambda folder: "loaded", name="tiny")
print(how, flush=True)
"""


def test_two_starts_at_once_convert_the_model_once(cache_root):
    """The second start waits for the first's conversion (saying so) and loads its entry: no second conversion."""
    support = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen([sys.executable, "-c", CONVERTING, "first"], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    second = None
    try:
        assert first.stdout.readline().strip() == "converting"  # it holds the conversion's lock now
        second = subprocess.Popen([sys.executable, "-c", CONVERTING, "second"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        said = []
        while not any("waiting for" in line for line in said):
            line = second.stderr.readline()
            assert line, f"the second start ended without waiting: {said} {second.stdout.read()!r}"
            said.append(line)
        assert f"process {first.pid}" in said[-1] and "converted model tiny-" in said[-1], said
        first.stdin.write("go\n")
        first.stdin.close()
        assert first.stdout.read().split() == ["built"]
        out, _ = second.communicate(timeout=120)
        assert out.split() == ["hit"], out  # it never converted
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_a_first_load_says_how_far_the_conversion_and_the_int4_copy_are(tiny_gguf, cache_root):
    """The loading screen's and run's status line hear the share of the GGUF's tensors converted and of the matrices
    copied to int4, in tenths, rising; a load from the cache converts nothing and says no share of it."""
    import re

    heard: list[str] = []
    load_model(tiny_gguf + "@int4", torch.device("cpu"), on_progress=heard.append)

    def shares(prefix):
        return [int(m.group(1)) for line in heard if (m := re.match(prefix + r".*: (\d+)% of \d+ ", line))]

    converted, copied = shares("converting tiny.gguf"), shares("int4 copy")
    assert len(converted) >= 5 and converted == sorted(converted) and converted[-1] < 100
    assert len(copied) >= 5 and copied == sorted(copied) and copied[-1] < 100
    heard.clear()
    load_model(tiny_gguf, torch.device("cpu"), on_progress=heard.append)
    assert not shares("converting")
