"""A verdict records the load it was taken under (specview/core/load.py); one taken under load is provisional: taken
again at the next quiet start, and it never replaces a quiet one (issue "neighbours" §1).

The load itself is said through SPECVIEW_LOAD (quiet / busy) where the verdict rules are tested: what else this
machine runs must not decide a test. The arithmetic of a measured load is tested on given samples."""

import json

import pytest

from specview.core import host, load
from specview.cpu import forward_choice
from specview.cpu.matmul import packed_linear


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    return tmp_path


def kept(cache, key):
    return json.loads((cache / packed_linear.CHOICE_FILE).read_text())[key]


def probe(key, figures):
    """kept_probe over one kernel, whose measurement records each call and returns `figures`."""
    calls = []

    def measure():
        calls.append(1)
        return figures

    seconds = packed_linear.kept_probe(key, ("stock",), measure, lambda s: {"kernel": "stock"})
    return seconds, len(calls)


FIGURES = {"stock_one": 1.0, "stock_rows": 2.0}
OTHER = {"stock_one": 3.0, "stock_rows": 4.0}


def test_a_verdict_under_load_is_kept_provisionally_and_taken_again_at_a_quiet_start(cache, monkeypatch):
    monkeypatch.setenv("SPECVIEW_LOAD", "busy")
    assert probe("k", FIGURES) == (FIGURES, 1)
    entry = kept(cache, "k")
    assert entry["load"]["quiet"] is False and load.provisional(entry)
    assert {"cores", "threads", "others_cores", "steal_cores", "loadavg"} <= set(entry["load"])
    assert probe("k", OTHER) == (FIGURES, 0)  # still busy: the provisional verdict serves, nothing measured
    monkeypatch.setenv("SPECVIEW_LOAD", "quiet")
    assert probe("k", OTHER) == (OTHER, 1)  # quiet now: taken again
    assert kept(cache, "k")["load"]["quiet"] is True
    assert probe("k", FIGURES) == (OTHER, 0)  # a quiet verdict stands
    monkeypatch.setenv("SPECVIEW_LOAD", "busy")
    assert probe("k", FIGURES) == (OTHER, 0)  # ...under load too


def test_a_verdict_that_says_nothing_of_its_load_is_provisional(cache, monkeypatch):
    """Verdicts written before loads were recorded (the issue's: an eager forward timed beside another run)."""
    host.store_cached(packed_linear.CHOICE_FILE, {"k": {"stock_one_s": 1.0, "stock_rows_s": 2.0, "kernel": "stock"}})
    monkeypatch.setenv("SPECVIEW_LOAD", "busy")
    assert probe("k", OTHER) == (FIGURES, 0)
    monkeypatch.setenv("SPECVIEW_LOAD", "quiet")
    assert probe("k", OTHER) == (OTHER, 1)


def test_a_verdict_under_load_never_replaces_a_quiet_one_kept_meanwhile(cache, monkeypatch):
    """A second process that probed under load while another kept a quiet verdict leaves the quiet one."""
    monkeypatch.setenv("SPECVIEW_LOAD", "busy")
    quiet = {"stock_one_s": 5.0, "stock_rows_s": 6.0, "kernel": "stock", "load": {"quiet": True}}

    def measure():  # the other process writes its quiet verdict while this one measures
        host.store_cached(packed_linear.CHOICE_FILE, {"k": quiet})
        return FIGURES

    assert packed_linear.kept_probe("k", ("stock",), measure, lambda s: {"kernel": "stock"}) == FIGURES
    assert kept(cache, "k") == quiet
    assert load.replaces(quiet, {"load": {"quiet": True}}) and load.replaces({"load": {"quiet": False}}, {})


@pytest.mark.parametrize(("threads", "busy", "quiet"), [(2, 0.1, True), (2, 0.5, False), (1, 1.0, True),
                                                         (1, 1.5, False)])
def test_quiet_means_the_others_fit_in_the_cores_the_threads_left_free(monkeypatch, threads, busy, quiet):
    monkeypatch.delenv("SPECVIEW_LOAD")
    monkeypatch.setattr(load, "cores", lambda: 2)
    # (wall s, busy s, steal s, own CPU s): this process took 1.5 s of the 2 s busy, over 2 s of wall time
    start, end = (10.0, 100.0, 0.0, 5.0), (12.0, 100.0 + 1.5 + 2 * busy, 0.0, 6.5)
    record = load.between(start, end, threads)
    assert record["others_cores"] == pytest.approx(busy) and record["quiet"] is quiet
    stolen = load.between(start, (12.0, 101.5, 2 * 0.5, 6.5), 2)  # the hypervisor's steal counts as load
    assert stolen["steal_cores"] == 0.5 and stolen["quiet"] is False
    assert ("quiet" if quiet else "under load") in load.describe(record)


def test_a_real_sample_reads_this_machines_counters(monkeypatch):
    monkeypatch.delenv("SPECVIEW_LOAD")
    with load.watch(1) as w:
        sum(range(10000))
    assert w.load["cores"] == load.cores() and w.load["threads"] == 1
    if w.load["others_cores"] is not None:  # Linux: /proc/stat read
        assert w.load["others_cores"] >= 0 and w.load["steal_cores"] >= 0 and isinstance(w.load["quiet"], bool)


def test_the_probe_repeats_until_its_candidates_separate_or_says_they_did_not(monkeypatch):
    """interleaved: a clear winner stops at the least rounds; two candidates alike run to the most and say so. On a
    clock each step moves by its cost (no timing: the test decides every figure)."""
    ticks, calls = [0.0], [0]
    costs = {"fast": 1.0, "slow": 3.0}
    monkeypatch.setattr(forward_choice.time, "perf_counter", lambda: ticks[0])

    def timed(index, name):
        def step():
            calls[0] += 1
            round_ = (calls[0] - 1) // 2
            ticks[0] += costs[name] + (round_ + index) % 2 * 0.1  # each round, one of the two is a little slower
        return step

    def probe():
        return forward_choice.interleaved({name: timed(i, name) for i, name in enumerate(costs)}, min_rounds=5,
                                          max_rounds=20, budget_s=1e9)

    clear = probe()
    assert clear.separated is True and clear.rounds == 5 and clear.ms["fast"] < clear.ms["slow"]
    costs["slow"], calls[0] = 1.0, 0
    alike = probe()
    assert alike.separated is False and alike.rounds == 20 and "did not separate" in alike.said()


def test_a_provisional_forward_verdict_serves_under_load_and_is_taken_again_when_quiet(small_llama_pair, cache,
                                                                                      monkeypatch):
    """The chooser's own verdict (kernels.json): an eager one taken under load is what a start under load runs, and
    says it is provisional; a quiet start takes it again (a run, the TUI and serve: in the background build)."""
    from specview.cpu.forward import aot_compile
    from specview.profiling.profile import describe_forward

    if aot_compile.unavailable_reason():
        pytest.skip(aot_compile.unavailable_reason())
    target, _ = small_llama_pair
    monkeypatch.delenv("SPECVIEW_COMPILE")
    key = forward_choice._key(target.model, "forward")
    loaded = {"cores": 2, "threads": 2, "others_cores": 1.0, "steal_cores": 0.0, "quiet": False}
    host.store_cached(forward_choice.CHOICE_FILE, {key: {
        "mode": "eager", "why": "one-token forward 1516.7 ms compiled against 410.4 ms eager (probe)",
        "one_row": "mm", "head": "dense", "load": loaded}})

    def no_probe(*args):
        raise AssertionError("a provisional verdict is not taken again under load")

    monkeypatch.setattr(forward_choice, "_probe_forward", no_probe)
    monkeypatch.setenv("SPECVIEW_LOAD", "busy")
    assert not forward_choice._first_time(target)
    choice = forward_choice.prepare(target, "auto")
    assert choice.mode == "eager" and choice.provisional and "1516.7" in choice.why
    assert "provisional" in describe_forward(target.spec, choice.to_json())
    monkeypatch.setenv("SPECVIEW_LOAD", "quiet")
    assert forward_choice._first_time(target)  # a background start builds and probes it again
    host.store_cached(forward_choice.CHOICE_FILE, {key: {
        "mode": "eager", "why": "quiet", "one_row": "mm", "head": "dense", "load": {**loaded, "quiet": True}}})
    assert not forward_choice._first_time(target)  # a quiet verdict stands
    assert forward_choice.prepare(target, "auto").why == "quiet"


def test_run_v_and_the_status_line_say_which_forward_runs_and_why():
    from types import SimpleNamespace

    from specview.profiling.profile import describe_forward, forward_brief
    from specview.tui.app import forward_label

    loaded = forward_choice.ForwardChoice("eager", "one-token forward 9.0 ms compiled against 4.0 ms eager (probe, "
                                                   "7 rounds; under load: ...)", provisional=True).to_json()
    assert forward_brief(loaded) == "eager: probe, provisional (taken under load)"
    assert "provisional" in describe_forward("t", loaded) and "9.0 ms compiled" in describe_forward("t", loaded)
    quiet = forward_choice.ForwardChoice("compiled", "one-token forward 4.0 ms compiled against 9.0 ms eager").to_json()
    assert "provisional" not in quiet and forward_brief(quiet) == "compiled: probe"
    assert forward_brief(forward_choice.ForwardChoice("eager", "--compile off").to_json()) == "eager: --compile off"
    info = SimpleNamespace(target="t", forwards={"t": loaded})
    assert forward_label([], info) == "forward eager: probe, provisional (taken under load)"
    assert forward_label([], None) == ""
