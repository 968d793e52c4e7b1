"""`specview --attach URL` to a serving engine: the figures from its counters (polled /metrics, and the requests
the TUI sends), the screen saying that an engine exports no p and q, and one line for a server it cannot watch.
Fake engines on a loopback port (tests/support/fake_engines.py)."""

import asyncio

from fake_engines import drafts_for, fake_engine, free_port

from helpers import run_cli
from specview.core.settings import Settings
from specview.remote.watch import NO_P_Q, EngineWatch, open_engine

PROMPT = "the cat sat on the mat and the cat sat"


def settings():
    return Settings(prompt=PROMPT, max_new_tokens=10, temperature=0.0)


def test_poll_and_request_read_the_engines_counts():
    with fake_engine("llama-server") as (_, url):
        watch = EngineWatch(open_engine(url), settings())
        try:
            total, recent = watch.poll()
            assert recent is None and total.drafted == 0
            asked = watch.request()
            drafted, accepted, steps, per_pos = drafts_for(PROMPT, 10)
            assert (asked.drafted, asked.accepted, asked.drafts) == (drafted, accepted, steps)
            assert asked.acceptance_rate == accepted / drafted and asked.tokens_per_step == 10 / (10 - accepted)
            assert asked.per_position == [a / steps for a in per_pos]
            total, recent = watch.poll()  # the request, seen from /metrics
            assert (recent.drafted, recent.accepted, recent.drafts) == (drafted, accepted, steps)
            assert total.acceptance_rate == accepted / drafted
        finally:
            watch.endpoint.close()


def test_vllm_without_requests_of_ours_shows_its_counters():
    with fake_engine("vllm") as (engine, url):
        engine.generate("some other client's prompt", 16)
        watch = EngineWatch(open_engine(url), settings())
        try:
            total, _ = watch.poll()
            drafted, accepted, _, _ = drafts_for("some other client's prompt", 16)
            assert (total.drafted, total.accepted, total.tokens) == (drafted, accepted, 16)
        finally:
            watch.endpoint.close()


def test_the_screen_says_no_p_and_q_and_shows_a_request():
    from specview.tui.engine_app import EngineApp

    async def scenario(url):
        app = EngineApp(EngineWatch(open_engine(url), settings()))
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.press("space")
            for _ in range(50):
                await pilot.pause(0.05)
                if app.answered is not None:
                    break
            head = str(app.query_one("#head").render())
            assert NO_P_Q in " ".join(head.split())
            assert app.answered is not None and app.answered.acceptance_rate is not None
            await pilot.press("q")
        return app.return_code

    with fake_engine("llama-server") as (_, url):
        assert asyncio.run(scenario(url)) == 0


def test_an_instruct_model_still_gives_n_tokens_and_an_early_end_is_said():
    """A raw prompt goes with ignore_eos (an instruct model answers it with end-of-sequence at once); with --chat an
    answer that ends before N is marked, and the screen says its figures cover those tokens only."""
    from dataclasses import replace

    from specview.tui.engine_app import EngineApp

    with fake_engine("vllm", template=True) as (engine, url):
        watch = EngineWatch(open_engine(url), settings())
        try:
            asked = watch.request()
        finally:
            watch.endpoint.close()
    assert (asked.tokens, asked.stop, asked.early) == (10, "length", None)
    assert engine.requests[-1][0] == "/v1/completions" and engine.requests[-1][1]["ignore_eos"] is True

    async def scenario(url):
        app = EngineApp(EngineWatch(open_engine(url), replace(settings(), chat=True)))
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.press("space")
            for _ in range(50):
                await pilot.pause(0.05)
                if app.answered is not None:
                    break
            text = " ".join(str(app.query_one("#text").render()).split())
            await pilot.press("q")
        return app.answered, text

    with fake_engine("vllm", template=True, eos_after=4) as (engine, url):
        answered, text = asyncio.run(scenario(url))
    assert engine.requests[-1][0] == "/v1/chat/completions" and engine.requests[-1][1]["ignore_eos"] is False
    assert (answered.tokens, answered.stop) == (4, "eos")
    assert "ended early (end-of-sequence after 4 tokens)" in text and "cover those tokens only" in text


def test_a_server_it_cannot_watch_is_one_line(capsys):
    with fake_engine("openai") as (_, url):
        code, _, err = run_cli(capsys, "--attach", url)
    assert code == 2 and "neither a specview server nor llama-server nor vLLM" in err
    assert len(err.strip().splitlines()) == 1
    with fake_engine("html") as (_, url):
        code, _, err = run_cli(capsys, "--attach", url)
    assert code == 2 and "not an OpenAI-compatible server" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "--attach", f"http://127.0.0.1:{free_port()}")
    assert code == 2 and "connection refused" in err and len(err.strip().splitlines()) == 1
