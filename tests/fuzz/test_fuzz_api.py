"""`specview serve` fuzzed from its own OpenAPI document (GET /openapi.json) with schemathesis, on tiny models on
a loopback port: every operation, requests that fit the schema (positive) and requests that break it
(negative), streamed and not, on a server without a token and on one with a token (sent right, wrong or not
at all). The properties, for every answer:

- no 5xx but 503; a streamed answer's records are JSON and end with `end` or a (non-5xx) `error`;
- every error is JSON {"error": str, "field": str | null};
- the answer fits the document (status code, content type, body schema), and a body that breaks the schema
  is refused with a 4xx;
- the next well-formed request still gets the right answer: the same greedy tokens as before the fuzzing
  (checked every CHECK_EVERY cases and after each operation).

The short form (make test) is seeded and small; make fuzz runs the long form (tests/support/fuzz_settings.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest
import requests
import schemathesis
from fuzz_settings import Budget, fuzz
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from serve_helpers import TIMEOUT, running_server

from specview.core.settings import Settings

TOKEN = "fuzz-t0ken"
GOOD = {"prompt": "w1 w2 w3", "max_new_tokens": 6, "temperature": 0, "ignore_eos": True, "k": 3}
CHECK_EVERY = 25
OPERATIONS = ["POST /generate", "POST /predict", "GET /health", "GET /live", "GET /metrics", "GET /events", "GET /openapi.json"]
# the short form: cases per (operation, mode); /generate is where the input is
SHORT = {"POST /generate": 40, "POST /predict": 15}


@dataclass
class Api:
    url: str
    schema: schemathesis.BaseSchema
    token: str | None
    greedy: list[int]  # GOOD's tokens before any fuzzing
    session: requests.Session
    cases: int = 0


@pytest.fixture(scope="module", params=[None, TOKEN], ids=["open", "token"])
def api(request, gpt2_paths, tmp_path_factory):
    target, draft = gpt2_paths
    settings = Settings(target=target, draft=f"{draft},ngram", max_new_tokens=8, k=3, threads=1,
                        profile_dir=str(tmp_path_factory.mktemp("fuzz-profiles")))
    token = request.param
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    with running_server(settings, token=token, cap=16, max_body=8192) as served:
        with httpx.Client(base_url=served.url, timeout=TIMEOUT, headers=auth) as client:
            greedy = client.post("/generate", json=GOOD).json()["generated_ids"]
        schema = schemathesis.openapi.from_url(served.url + "/openapi.json", headers=auth, timeout=TIMEOUT)
        with requests.Session() as session:
            yield Api(served.url, schema, token, greedy, session)


def content_type(response) -> str:
    value = response.headers.get("content-type", "")  # schemathesis' Response: lists of values
    return value[0] if isinstance(value, list) else value


def check_error_shape(response) -> None:
    status = response.status_code
    assert status < 500 or status == 503, f"{status}: {response.content[:300]!r}"
    if status >= 400:
        assert content_type(response).startswith("application/json"), response.headers
        body = json.loads(response.content)
        assert isinstance(body, dict) and set(body) == {"error", "field"}, body
        assert isinstance(body["error"], str) and body["error"], body
        assert body["field"] is None or isinstance(body["field"], str), body


def check_stream(text: str) -> None:
    """A streamed /generate: `data:` lines of JSON records, the last one `end` or an error of the client's."""
    records = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    assert records, text[:300]
    assert all(isinstance(r, dict) and "type" in r for r in records), text[:300]
    last = records[-1]
    assert last["type"] in ("end", "error"), last
    if last["type"] == "error":
        assert last["status"] < 500 or last["status"] == 503, last
    assert all(r["type"] not in ("end", "error") for r in records[:-1]), [r["type"] for r in records]


def check_still_right(api: Api) -> None:
    headers = {"Authorization": f"Bearer {api.token}"} if api.token else {}
    r = api.session.post(api.url + "/generate", json=GOOD, headers=headers, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.json()["generated_ids"] == api.greedy


def send(api: Api, case, credential: str):
    headers = dict(case.headers or {})
    headers.pop("Authorization", None)
    if api.token and credential == "right":
        headers["Authorization"] = f"Bearer {api.token}"
    elif api.token and credential == "wrong":
        headers["Authorization"] = "Bearer not-the-token"
    case.headers = headers
    if case.path == "/events":  # a stream that never ends: look at the head, then hang up
        kwargs = case.as_transport_kwargs(base_url=api.url)
        raw = api.session.request(**kwargs, stream=True, timeout=TIMEOUT)
        if raw.status_code == 200:
            assert raw.headers["content-type"].startswith("text/event-stream")
            raw.close()
            return None
        raw.content  # noqa: B018 - an error body: read it whole
        return raw
    return case.call(base_url=api.url, session=api.session, timeout=TIMEOUT)


CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance, negative_data_rejection]


# negative cases need something to break: a body (Last-Event-ID is any string; the hostile-input tests send odd ones)
CASES = [(op, GenerationMode.POSITIVE) for op in OPERATIONS] + \
        [(op, GenerationMode.NEGATIVE) for op in ("POST /generate", "POST /predict")]


@pytest.mark.parametrize(("operation", "mode"), CASES, ids=[f"{op}-{mode.value}" for op, mode in CASES])
def test_every_answer_is_clean_and_the_next_good_request_is_still_right(api, operation, mode):
    method, path = operation.split()
    op = api.schema[path][method]
    credentials = st.sampled_from(["right", "right", "right", "none", "wrong"] if api.token else ["none"])
    budget = Budget()

    @fuzz(SHORT.get(operation, 6), 400)
    @given(case=op.as_strategy(generation_mode=mode), credential=credentials)
    def one(case, credential):
        if budget.spent():
            return
        response = send(api, case, credential)
        if response is None:
            return
        check_error_shape(response)
        if response.status_code == 200 and content_type(response).startswith("text/event-stream"):
            check_stream(response.content.decode())
        case.validate_response(response, checks=CHECKS)
        api.cases += 1
        if api.cases % CHECK_EVERY == 0:
            check_still_right(api)

    one()
    check_still_right(api)
