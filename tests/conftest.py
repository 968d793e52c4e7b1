import atexit
import os
import shutil
import sys
import tempfile

# The helpers every test imports by name (tiny, helpers, serve_helpers, fuzz_settings) live in tests/support/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

os.environ["HF_HUB_OFFLINE"] = "1"  # no test may reach a model hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# --compile auto runs transformers' forward in tests (no inductor build per tiny model shape); the tests of
# the compiled path ask for it with compile="on" / --compile on (tests/cpu/test_compiled.py, test_lossless.py).
os.environ["SPECVIEW_COMPILE"] = "0"
# The compiled path runs through torch.compile here: an ahead-of-time package costs ~10-25 s to build per
# function and tiny shape. tests/cpu/test_compiled.py builds one model's packages and checks them.
os.environ["SPECVIEW_AOT"] = "0"
# Every measurement counts as quiet (specview/core/load.py): a kept verdict must not be taken again, or not, by what
# else the machine runs meanwhile (the other worker). tests/core/test_load.py sets what it tests.
os.environ["SPECVIEW_LOAD"] = "quiet"
# The converted-weights cache (specview/models/gguf_cache.py) of a test session lives in a temp folder:
# tests never read or fill the user's ~/.cache/specview (the bundled model is converted once per session).
os.environ["SPECVIEW_CACHE_DIR"] = tempfile.mkdtemp(prefix="specview-test-cache-")
atexit.register(shutil.rmtree, os.environ["SPECVIEW_CACHE_DIR"], True)
# Except what is built from specview/cpu's code (tests/support/build_cache.py: kept between the sessions of this
# machine, outside the checkout). The thin kernels' C++ library: its builds are flock'ed and moved into place whole,
# and a library's name carries its sources' hash and flags, so a changed kernel is built again. And compiled code:
# inductor's cache (its FX graphs, kernels and the precompiled header every AOT package's wrapper is built against)
# and the AOT packages (aot_compile.aot_dir), keyed by all they were built from and written whole (os.replace; the
# packages flock'ed): the two workers of a run build each graph and package once, and a later session loads them, as
# a user's second start does. The tests of building itself give it folders of their own (tmp_path).
from build_cache import kept_folder  # noqa: E402

_KERNELS = kept_folder("thin-kernels")
os.symlink(_KERNELS, os.path.join(os.environ["SPECVIEW_CACHE_DIR"], "thin_kernels"))
_COMPILED = kept_folder("compiled")
for _name in ("inductor", "aot"):
    (_COMPILED / _name).mkdir(exist_ok=True)
    os.symlink(_COMPILED / _name, os.path.join(os.environ["SPECVIEW_CACHE_DIR"], _name))

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

import tiny  # noqa: E402
from specview.models.loader import load_pair  # noqa: E402

hf_logging.disable_progress_bar()  # save_pretrained's bars would pollute captured stderr
torch.set_num_threads(1)  # tiny models: threads only add overhead, and the machine is shared


# make test runs the whole suite on two workers (pytest -n 2 --dist loadgroup). The exact-law, check, compiled-path
# and tree files are pure computation (thousands of sampled runs, kernel builds): their tests are spread one
# by one. Every other file runs whole on one worker, in its order, as written: its fixtures, servers, terminals
# and signals stay in one process, and the two workers only share the machine.
SPREAD = {"test_lossless.py", "test_policies.py", "test_compiled.py", "test_trees.py", "test_check.py",
          "test_background_build.py", "test_device_rules.py"}


# The order the workers take the work in (make test passes --no-loadscope-reorder, else xdist orders the groups by
# their number of tests): the longest first, so the run does not end on one worker still inside a long group while
# the other has nothing left. Where a test or a file is not long, its builds are (AOT packages, inductor, kernels).
LONGEST_FIRST = (
    "tests/engine/test_law_default_path.py",  # builds the default path's AOT packages, then samples the law
    "tests/cpu/test_thin_kernels.py",  # compiled forwards on the kernels
    "tests/cpu/test_cache_faults.py",  # a warm cache of its own built, broken and run again in real processes
    "tests/cpu/test_compiled.py::test_ahead_of_time_packages",
    "tests/engine/test_trees.py::test_one_forward_over_the_tree_gives_each_path_its_logits",
    "tests/cpu/test_compiled.py::test_the_one_row_layer",
    "tests/cpu/test_onnx_mlas.py",
    "tests/fuzz/test_fuzz_serve_inputs.py",
    "tests/engine/test_engine.py",
    "tests/eval/test_eval.py",
)

# make test-fast (-m "not slow") leaves out what takes minutes and changes least often: the exact-law and check files
# (thousands of sampled runs a test), the compiled path (inductor and AOT builds: every test whose skip says it
# cannot compile here), a kernel library built again from its sources, the fuzzers' examples, the bundled model
# (converted and quantized once a session), and the longest runs of a whole command in a process of its own (real
# signals, a load of 16 clients, a pair built at size).
SLOW = ("tests/engine/test_lossless.py", "tests/engine/test_policies.py", "tests/engine/test_trees.py",
        "tests/engine/test_law_default_path.py", "tests/engine/test_device_rules.py", "tests/cpu/test_compiled.py",
        "tests/cpu/test_background_build.py", "tests/cpu/test_cache_faults.py", "tests/analysis/test_check.py",
        "tests/fuzz/",
        "tests/cpu/test_thin_kernels.py::test_the_paths_other_cpus_take_compute_the_same_products",
        "tests/models/test_bundled.py", "tests/drafters/test_drafters.py::test_an_int4_target_drafts_with_ngram",
        "tests/eval/test_eval.py::test_a_real_sigint", "tests/cli/test_cli.py::test_real_signal_mid_run",
        "tests/serve/test_serve.py::test_load_from_16_clients", "tests/cli/test_bad_input.py::test_truncated_safetensors",
        "tests/bench/test_bench_pair.py::test_build_pair_writes_a_loadable_pair")


def _needs_a_compiler(item) -> bool:
    """A test of the compiled path (its skip says it cannot compile here): it builds with inductor."""
    return any(mark.name == "skipif" and "compile" in str(mark.kwargs.get("reason", ""))
               for mark in item.iter_markers())


def _rank(item) -> int:
    for i, prefix in enumerate(LONGEST_FIRST):
        if item.nodeid.startswith(prefix):
            return i
    return len(LONGEST_FIRST) + (item.path.name in SPREAD)  # then the other files, the tests spread one by one last


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: left out by make test-fast (tests/conftest.py, SLOW)")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
        if item.nodeid.startswith(SLOW) or _needs_a_compiler(item):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_rank)  # stable: each file's tests stay in their order


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


def _pair(tiny_dir, kind, vocab, target_seed, draft_seed, scale, **kw):
    tok = tiny.make_tokenizer(vocab)
    t = tiny.save(tiny.make_model(kind, vocab, target_seed, scale=scale, **kw), tok, tiny_dir / f"{kind}-{vocab}-{target_seed}-{scale}")
    d = tiny.save(tiny.make_model(kind, vocab, draft_seed, scale=scale, **kw), tok, tiny_dir / f"{kind}-{vocab}-{draft_seed}-{scale}")
    return t, d


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def pair_paths(request, tiny_dir):
    """(target folder, draft folder): two unrelated random models of a family, one tokenizer, vocab 16."""
    return _pair(tiny_dir, request.param, 16, 0, 1, scale=4.0)


@pytest.fixture(scope="session")
def gpt2_paths(tiny_dir):
    return _pair(tiny_dir, "gpt2", 16, 0, 1, scale=4.0)


@pytest.fixture(scope="session")
def small_vocab_pair(tiny_dir):
    """Vocab 8 so the joint law of 3 tokens (512 sequences) can be enumerated exactly. The draft is the
    target plus noise: accepted 40-75% of the time, so accepts, rejections and bonuses all occur."""
    t, d = tiny.save_noisy_pair(tiny_dir, "small", "gpt2", 8, 10, scale=8.0, noise=0.3, noise_seed=3)
    return load_pair(t, d, torch.device("cpu"))


@pytest.fixture(scope="session")
def small_llama_pair(tiny_dir):
    """small_vocab_pair's Llama twin (vocab 8): the family the engine's own compiled forward runs."""
    t, d = tiny.save_noisy_pair(tiny_dir, "small-llama", "llama", 8, 10, scale=8.0, noise=0.3, noise_seed=3)
    return load_pair(t, d, torch.device("cpu"))


@pytest.fixture
def fast_vocab_pair(small_vocab_pair):
    """small_vocab_pair on the engine's own eager forward for one test (laws.on_engine_forward): the law tests'."""
    from laws import on_engine_forward

    with on_engine_forward(*small_vocab_pair):
        yield small_vocab_pair


@pytest.fixture(scope="session")
def loaded_pair(pair_paths):
    return load_pair(*pair_paths, torch.device("cpu"))


# ---- the skip gate (make test sets SPECVIEW_SKIP_GATE=1) -------------------------------------------------------
# A test may skip only for what this machine lacks: an optional extra (llama.cpp), hardware (AVX2 / AVX-512 / CUDA),
# a compiler, a platform, or a pinned tool's version. Any other skip is a test that stopped testing (a kernel whose
# loader failed, a fixture that found nothing) and fails the gated run. The reasons expected, as they read:
EXPECTED_SKIPS = (
    "could not import 'llama_cpp'",  # pytest.importorskip: the [llamacpp] extra is not installed
    "llama-server is not built",  # the optional extra of `make engines` (tests/remote/test_llama_server.py)
    "vLLM is not installed",  # the other optional extra of `make engines` (tests/remote/test_vllm.py)
    "this CPU has no",  # a kernel path for flags this CPU lacks (its build is that path already)
    "no AVX2, FMA or C++ compiler here",
    "cannot compile here",  # aot_compile.unavailable_reason: no C++ compiler or no inductor
    "tests the error raised without CUDA",
    "not Linux",
    "no oneDNN",  # a torch built without it
    "snapshots drawn with textual",  # the TUI snapshots are drawn with one textual version
    "the greedy text is one repeated token",  # the bundled model's text at that setting: nothing to compare
)


def _skips(config) -> tuple[int, list[str]]:
    """(skips, the reasons of the unexpected ones), from the terminal reporter's records (xdist's controller
    receives its workers' reports there)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    reports = reporter.stats.get("skipped", []) if reporter is not None else []
    unexpected = []
    for report in reports:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not any(expected in reason for expected in EXPECTED_SKIPS):
            unexpected.append(f"{report.nodeid}: {reason}")
    return len(reports), unexpected


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("SPECVIEW_SKIP_GATE") != "1" or hasattr(session.config, "workerinput"):
        return
    _, unexpected = _skips(session.config)
    if unexpected and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("SPECVIEW_SKIP_GATE") != "1" or hasattr(config, "workerinput"):
        return
    count, unexpected = _skips(config)
    terminalreporter.write_line(f"skipped: {count} ({count - len(unexpected)} expected: optional extras, hardware, "
                                f"platform; {len(unexpected)} unexpected)")
    for line in unexpected:
        terminalreporter.write_line(f"unexpected skip (fails the run, tests/conftest.py EXPECTED_SKIPS): {line}",
                                    red=True)


@pytest.fixture(autouse=True)
def _originals_back():
    """A test that settles a compiled forward on a shared (session) model releases that model's originals (one copy
    of each weight, cpu/forward/one_copy.py); a later test may read the model through transformers' forward, so they
    come back after every test. The installed forwards stay: they read their copies, which are untouched."""
    yield
    from specview.cpu.forward import one_copy

    for model in list(one_copy._released.keys()):
        one_copy.restore(model)
