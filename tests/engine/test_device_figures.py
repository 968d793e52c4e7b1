"""Figures measured on a device (issue 43): what must be synchronised before a host clock is read, what is reset per
run, what names the device. No GPU here: the device calls are recorded through engine/device.py's seams, and a
module on the `meta` device stands for a GPU's."""

import pytest
import torch

import specview.engine.device as devices
from specview.core import host
from specview.core.settings import SamplingConfig, Settings
from specview.cpu.matmul import packed_linear
from specview.engine.decoder import Decoder
from specview.session import open_session

PROMPT = [1, 4, 7, 3]


@pytest.fixture
def calls(monkeypatch):
    """Every device synchronize and peak reset the engine asks for, in order, with the forwards between them."""
    seen = []
    monkeypatch.setattr(devices, "synchronize", lambda device: seen.append("sync"))
    monkeypatch.setattr(devices, "reset_peak", lambda device: seen.append("reset"))
    return seen


def test_the_prefill_is_timed_to_its_end(small_vocab_pair, calls, monkeypatch):
    """prefill_ms timed the kernels' launch: the prefill's work landed in step 1's `other`."""
    target, draft = small_vocab_pair
    decoder = Decoder(target, draft, SamplingConfig(1.0), k=2, seed=0, ignore_eos=True)
    forward = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **kw: (calls.append("forward"), forward(*a, **kw))[1])
    run = decoder.start(PROMPT, 6)
    calls.clear()
    timer_start = decoder.timer.start_step
    monkeypatch.setattr(decoder.timer, "start_step", lambda: (calls.append("step"), timer_start())[1])
    run.step()
    assert calls[:4] == ["forward", "forward", "sync", "step"]  # target and draft prefilled, then waited for


def test_the_device_peak_is_reset_per_run(small_vocab_pair, calls):
    target, draft = small_vocab_pair
    decoder = Decoder(target, draft, SamplingConfig(1.0), k=2, seed=0, ignore_eos=True)
    decoder.start(PROMPT, 4)
    decoder.start(PROMPT, 4)
    assert calls == ["reset", "reset"]


def test_calibrate_times_each_forward_to_its_end(gpt2_paths, calls):
    from specview.analysis.calibrate import measure_drafter, measure_target

    session = open_session(Settings(target=gpt2_paths[0], draft=gpt2_paths[1], prompt="w1 w2 w3", device="cpu"))
    calls.clear()
    measure_target(session, [1, 2], repeats=1)
    assert calls.count("sync") == 2 * 2 * 2  # (warm-up + 1 round) x 2 row counts, a sync before and after each
    calls.clear()
    measure_drafter(session, session.drafters[0], 2, repeats=1)
    assert calls.count("sync") == 2 * 2


def test_the_cost_key_names_the_device():
    cpu = host.cost_key("t", 1, "2.6", "eager")
    assert host.cost_key("t", 1, "2.6", "eager", "cpu", None) == cpu  # curves calibrated on a CPU keep their key
    gpu = host.cost_key("t", 1, "2.6", "eager", "cuda:0", "NVIDIA A10G")
    assert gpu != cpu and "cuda:0" in gpu and "A10G" in gpu
    meta = {"cpu": host.cpu_summary(), "target": "t", "threads": 1, "versions": {"torch": "2.6"},
            "device": "cuda:0", "device_name": "NVIDIA A10G"}
    assert host.profile_cost_key(meta) == gpu


def test_the_device_is_named(monkeypatch, gpt2_paths):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10G")
    assert devices.name("cuda:0") == "NVIDIA A10G" and devices.name("mps") == "mps" and devices.name("cpu") is None
    session = open_session(Settings(target=gpt2_paths[0], draft=gpt2_paths[1], prompt="w1", device="cpu"))
    assert session.meta()["device_name"] is None and session.meta()["device"] == "cpu"


def test_packed_linears_pass_over_a_device_model_without_probing(monkeypatch):
    """install() timed the CPU kernels for every Linear before it looked at the module's device."""
    def probe(*args, **kwargs):
        raise AssertionError("probed a device model's Linear")

    monkeypatch.setattr(packed_linear, "wanted", probe)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64, device="meta"))
    packed_linear.install(model)
    assert "forward" not in model[0].__dict__


class FakeEvent:
    """A device event whose elapsed time is the record order (ms): what PhaseTimer reads from torch.mps.event.Event."""

    clock = [0]

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        FakeEvent.clock[0] += 1
        self.at = FakeEvent.clock[0]

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return float(end.at - self.at)


def test_mps_phases_and_norms_are_timed_by_events_not_syncs(monkeypatch):
    """MPS synchronised at every phase edge and around every norm: that distorts what it measures."""
    from specview.engine.phase_timer import PhaseTimer
    from specview.profiling.hooks import NormHooks

    def no_sync():
        raise AssertionError("a device sync at a phase edge")

    monkeypatch.setattr(torch.mps, "synchronize", no_sync)
    monkeypatch.setattr(torch.mps.event, "Event", FakeEvent)
    timer = PhaseTimer("mps")
    hooks = NormHooks(timer)
    norm = torch.nn.Sequential(torch.nn.LayerNorm(4))
    assert hooks.install(norm) == 1
    timer.start_step()
    with timer.phase("verify"):
        norm(torch.ones(1, 4))
    with timer.phase("sample"):
        pass
    phases, _ = timer.end_step()
    assert timer.parts["layernorm"] == {"verify": 1.0}  # events recorded around the norm, inside verify
    assert phases["layernorm"] == 1.0 and timer.ms["verify"] == 3.0 and timer.ms["sample"] == 1.0


def test_an_int4_draft_is_quantized_on_the_host_before_it_moves(monkeypatch, tiny_dir):
    """@int4 on CUDA moved the full-precision base to the GPU, then quantized it there."""
    import tiny
    from specview.models import int4, loader

    path = tiny.save(tiny.make_model("llama", 16, 4, width=64), tiny.make_tokenizer(16), tiny_dir / "int4-host")
    seen = {}
    monkeypatch.setattr(int4, "check_int4_supported", lambda *a, **kw: None)
    monkeypatch.setattr(loader, "_int4_copy", lambda base, src, cache, say: seen.setdefault("at", base.device) and base)
    monkeypatch.setattr(int4, "to_device", lambda model, device: seen.setdefault("moved", device) and model,
                        raising=False)
    loader.load_model(path + "@int4", torch.device("meta"))
    assert seen == {"at": torch.device("cpu"), "moved": torch.device("meta")}


class Event:
    """What top_operators reads of a torch.profiler FunctionEvent."""

    def __init__(self, name, parent=None, device_us=0.0, cpu_us=0.0, label=False, kernel=False):
        self.name, self.cpu_parent, self.is_user_annotation = name, parent, label
        self.self_device_time_total, self.self_cpu_time_total, self.cpu_time_total = device_us, cpu_us, cpu_us
        self.device_type = torch.autograd.DeviceType.CUDA if kernel else torch.autograd.DeviceType.CPU


def test_the_cuda_operator_table_counts_each_kernel_once_in_device_time():
    """--profile-ops on CUDA counted a kernel under its operator and again as a kernel event, and divided an
    operator's device time by its phase's host span."""
    from specview.profiling.ops import top_operators

    verify = Event("verify", label=True, cpu_us=10_000)  # the label's host span: launches, 10 ms
    mm = Event("aten::mm", parent=verify, device_us=2_000, cpu_us=50)
    add = Event("aten::add", parent=verify, device_us=500, cpu_us=20)
    kernels = [Event("gemm_kernel", device_us=2_000, kernel=True), Event("add_kernel", device_us=500, kernel=True)]
    ops = top_operators([verify, mm, add, *kernels], cuda=True)
    assert ops["total_self_ms"] == 2.5 and [op["name"] for op in ops["top"]] == ["aten::mm", "aten::add"]
    assert ops["phase_ms"]["verify"] == 2.5 and ops["top"][0]["verify_share"] == 0.8


def test_device_traces_place_phases_by_their_events(monkeypatch):
    """On CUDA the traces used host launch spans while phases_ms used events: the two disagreed."""
    from specview.engine.phase_timer import PhaseTimer

    monkeypatch.setattr(torch.mps.event, "Event", FakeEvent)
    FakeEvent.clock[0] = 0
    timer = PhaseTimer("mps")
    timer.start_step()  # origin event at 1
    with timer.phase("draft"):  # events 2, 3
        pass
    with timer.phase("verify"):  # events 4, 7 (the norm's 5, 6 recorded by hand here)
        norm_start, norm_end = FakeEvent(), FakeEvent()
        norm_start.record()
        norm_end.record()
        timer.nested_device("layernorm", norm_start, norm_end, 0.0, 0.0)
    timer.end_step()
    t0 = timer.last.t0
    offsets = [(name, (a - t0) * 1000, (b - t0) * 1000) for name, a, b in timer.last.spans]
    scale = offsets[0][1]  # the origin is event 1, draft starts at 2: one fake ms, scaled as phases_ms was
    assert [name for name, _, _ in offsets] == ["draft", "verify"]
    assert [(a / scale, b / scale) for _, a, b in offsets] == [pytest.approx((1, 2)), pytest.approx((3, 6))]
    [(name, part, a, b)] = timer.last.nested_spans
    assert ((a - t0) * 1000 / scale, (b - t0) * 1000 / scale) == pytest.approx((4, 5))
    assert (name, part) == ("layernorm", "verify")


@pytest.fixture
def mps_memory(monkeypatch):
    """torch.mps's two memory figures, set by the test (MiB): what memory_mb reads on device type mps."""
    from specview.engine.memory import MB

    figures = {"allocated": 0, "driver": 0}
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: figures["allocated"] * MB)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: figures["driver"] * MB)
    return figures


def test_mps_memory_names_the_driver_total_and_samples_the_peak(mps_memory):
    """On MPS 'reserved' was the driver's total and the peak was missing: MPS has no pool and no peak counter."""
    from specview.engine.memory import memory_mb

    mps = torch.device("mps")
    mps_memory.update(allocated=100, driver=900)
    devices.reset_peak(mps)  # a run starts
    mps_memory["allocated"] = 300
    memory_mb(mps)  # the end of a step
    mps_memory["allocated"] = 200
    figures = memory_mb(mps)
    assert figures["device_allocated"] == 200 and figures["device_driver"] == 900
    assert figures["device_reserved"] is None  # no caching pool to report; the driver's total is not one
    assert figures["device_peak"] == 300  # the largest allocation seen at a step's edge since the run started
    devices.reset_peak(mps)  # the next run's peak is its own
    assert memory_mb(mps)["device_peak"] == 200


def test_the_mps_memory_line_says_rss_misses_gpu_buffers(mps_memory, gpt2_paths):
    from specview.session import memory_line

    session = open_session(Settings(target=gpt2_paths[0], draft=gpt2_paths[1], prompt="w1", device="cpu"))
    assert "GPU" not in memory_line(session.memory()) and "peak / weights" in memory_line(session.memory())
    mps_memory["driver"] = 1234
    session.device = torch.device("mps")  # what memory() reads of the session on a Mac
    line = memory_line(session.memory())
    assert "RSS does not include GPU buffers" in line and "MPS driver holds 1,234 MiB" in line
    assert "peak / weights" not in line  # the weights sit in GPU buffers, outside RSS
