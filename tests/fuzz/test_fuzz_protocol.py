"""The JSON-lines stream between the TUI and its engine process (specview/backend/engine_stream.py, specview/tui/process.py),
fuzzed from both ends. Whatever line the engine reads (not JSON, not an object, unknown commands, k as a
string, 1e309 or NaN, bytes that are not UTF-8), it answers with records that are JSON, an error being one
line, and it still steps afterwards. Whatever line the viewer reads (a stray print, a record of the wrong
shape, a step record with wrong types), it gets a record or one SpecviewError line, never a traceback."""

from __future__ import annotations

import copy
import io
import json
import math
import subprocess
import sys
from dataclasses import asdict

import pytest
from fuzz_settings import fuzz
from hypothesis import example, given
from hypothesis import strategies as st

from specview.backend.engine_stream import COMMANDS, Service
from specview.core.errors import SpecviewError
from specview.core.settings import Settings
from specview.tui.process import CHILD, ProcessBackend, step_view


@pytest.fixture(scope="module")
def settings(gpt2_paths, tmp_path_factory):
    return Settings(target=gpt2_paths[0], draft=f"{gpt2_paths[1]},ngram", prompt="w1 w2 w3", max_new_tokens=100,
                    k=3, temperature=0.0, ignore_eos=True, threads=1,
                    profile_dir=str(tmp_path_factory.mktemp("protocol-profiles")))


@pytest.fixture(scope="module")
def service(settings):
    out = io.StringIO()
    service = Service(settings, out)
    assert service.answer(json.dumps({"cmd": "load"}))
    return service, out


def records_of(out: io.StringIO) -> list[dict]:
    lines = out.getvalue().splitlines()
    out.seek(0)
    out.truncate()
    records = [json.loads(line) for line in lines]  # every line the engine writes is JSON (no NaN)
    assert all(isinstance(r, dict) and isinstance(r.get("type"), str) for r in records), records
    return records


json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=3), max_leaves=6)
# quit ends the stream, load reloads the models and save writes a profile: sent by the tests below, not here
command = st.fixed_dictionaries({"cmd": st.one_of(st.sampled_from([c for c in COMMANDS if c not in ("quit", "load",
                                                                                                   "save")]),
                                                  json_value)},
                                optional={"k": st.one_of(st.integers(-5, 40), json_value, st.just(10**30)),
                                          "final": json_value})
line = st.one_of(command.map(lambda c: json.dumps(c, allow_nan=True)), json_value.map(json.dumps),
                 st.text(max_size=30).filter(lambda t: "\n" not in t and "\r" not in t and t.strip()))


@fuzz(150, 3000)
@given(lines=st.lists(line, min_size=1, max_size=6))
@example(lines=['{"cmd": "step", "k": 1e309}', '{"cmd": "step", "k": NaN}', '{"cmd": "step", "k": "4"}'])
@example(lines=["[1, 2]", '"step"', "null", "{", "\ufffd\ufffd", "[" * 5000])
@example(lines=['{"cmd": "new_run", "k": true}', '{"cmd": {"x": 1}}', '{"k": 3}'])
def test_any_command_line_gets_json_records_and_the_engine_still_steps(service, lines):
    service_, out = service
    for text in lines:
        assert service_.answer(text) is True  # only quit ends the stream
        records = records_of(out)
        assert records, text
        for r in records:
            if r["type"] == "error":
                assert r["message"] and "\n" not in r["message"] and r["fatal"] is False, r
                assert "Error:" not in r["message"], r  # the stream's own words, not a Python exception's
    assert service_.answer(json.dumps({"cmd": "new_run"}))
    assert service_.answer(json.dumps({"cmd": "step"}))
    step = records_of(out)[-1]
    assert step["type"] == "step" and step["step"] == 0 and step_view(step).step.emitted


def test_commands_out_of_order_are_error_records(settings):
    out = io.StringIO()
    fresh = Service(settings, out)
    for text in ('{"cmd": "step"}', '{"cmd": "new_run"}', '{"cmd": "next_drafter"}'):
        fresh.answer(text)
        (r,) = records_of(out)
        assert r["type"] == "error" and "before load" in r["message"]
    fresh.answer('{"cmd": "load"}')
    fresh.answer('{"cmd": "load"}')
    assert records_of(out)[-1]["message"] == "already loaded"


def test_a_real_engine_process_survives_garbage_bytes_and_quits_cleanly(settings):
    garbage = [b"\xff\xfe\x80 not utf-8\n", b"[1]\n", b'{"cmd": "step", "k": 1e309}\n', b"\x00\n", b"{\n",
               b'{"cmd": "load"}\n', b'{"cmd": "step", "k": "2"}\n', b'{"cmd": "step", "k": 2}\n',
               b'{"cmd": "quit"}\n']
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(asdict(settings))],
                          input=b"".join(garbage), capture_output=True, timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode()[-500:]
    records = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    kinds = [r["type"] for r in records if r["type"] != "progress"]
    assert kinds == ["error"] * 5 + ["loaded", "error", "step", "saved"], kinds


# -- the viewer's side ---------------------------------------------------------------------------------------


class FakeChild:
    """What ProcessBackend talks to: the lines a child would write, then end of output."""

    def __init__(self, lines: list[str]):
        self.stdin = io.StringIO()
        self.stdout = io.StringIO("".join(x + "\n" for x in lines))
        self.returncode = None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self.returncode = 1
        return 1


def viewer(settings, lines: list[str]) -> ProcessBackend:
    backend = ProcessBackend(settings)
    backend.proc = FakeChild(lines)
    return backend


@pytest.fixture(scope="module")
def good_step(service):
    service_, out = service
    service_.answer(json.dumps({"cmd": "new_run"}))
    records_of(out)
    service_.answer(json.dumps({"cmd": "step"}))
    return records_of(out)[-1]


HOSTILE = [None, True, -1, 10**30, math.nan, "x", [], [None], {}, {"a": "b"}, 1.5]


@st.composite
def damaged_step(draw, record):
    record = dict(record)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(record)))
        if draw(st.booleans()):
            record[key] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))
        else:
            record.pop(key)
    return record


def one_record_or_one_line(call):
    try:
        return call()
    except SpecviewError as err:
        assert str(err) and "\n" not in str(err), str(err)
        return None


def test_any_step_record_is_a_step_or_one_line(settings, good_step):
    assert one_record_or_one_line(lambda: viewer(settings, [json.dumps(good_step)]).step()) is not None

    @fuzz(200, 4000)
    @given(record=damaged_step(good_step))
    def one(record):
        view = one_record_or_one_line(lambda: viewer(settings, [json.dumps(record, allow_nan=True)]).step())
        if view is not None:  # what the widgets will read is there, of its type
            assert isinstance(view.step.emitted, list) and isinstance(view.texts, dict)

    one()


@fuzz(150, 3000)
@given(lines=st.lists(st.one_of(json_value.map(lambda v: json.dumps(v, allow_nan=True)), st.text(max_size=20).filter(
    lambda t: "\n" not in t and "\r" not in t), st.sampled_from(['{"type": "error"}', '{"type": "progress"}',
                                                                '{"type": "run", "run": "x"}', '{"type": 3}',
                                                                '{"type": "saved", "path": 5}',
                                                                '{"type": "drafter", "spec": null}'])),
                      max_size=4))
def test_any_line_from_the_engine_is_a_record_or_one_line(settings, lines):
    for call in ("new_run", "next_drafter", "step", "save"):
        backend = viewer(settings, lines)
        method = getattr(backend, call)
        one_record_or_one_line(method if call != "save" else lambda b=backend: b._save(False))


def test_a_stray_print_on_the_child_stdout_is_skipped(settings, good_step):
    backend = viewer(settings, ["loading weights...", "[1, 2]", json.dumps(good_step)])
    assert backend.step().step.step == good_step["step"]
    assert "stdout: loading weights..." in backend.stderr_tail
