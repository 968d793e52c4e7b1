"""GET /openapi.json: the server's API as an OpenAPI 3.1 document, built from the same pydantic models that
check the requests (schema.py), so the two cannot drift. The request schemas carry this server's limits
(max_new_tokens up to --max-new-tokens-cap, draft one of the loaded drafters); every error answer is the
`Error` shape. Clients can generate code from it; the fuzz tests (schemathesis) generate requests from it."""

from __future__ import annotations

from specview.serve.schema import GenerateRequest, PredictRequest

ERROR = {"type": "object", "required": ["error", "field"], "additionalProperties": False,
         "properties": {"error": {"type": "string"}, "field": {"type": ["string", "null"]}}}
END = {"type": "object", "required": ["type", "generated_ids", "text", "stop_reason"],
       "properties": {"type": {"const": "end"}, "generated_ids": {"type": "array", "items": {"type": "integer"}},
                      "text": {"type": "string"}, "stop_reason": {"type": "string"}}}
GENERATED = {"type": "object", "required": ["text", "generated_ids", "summary", "request"],
             "properties": {"text": {"type": "string"}, "generated_ids": {"type": "array", "items": {"type": "integer"}},
                            "summary": {"$ref": "#/components/schemas/End"}, "request": {"type": "integer"}}}
PREDICTED = {"type": "object", "required": ["text", "generated_text", "summary"],
             "properties": {"text": {"type": "string"}, "generated_text": {"type": "string"},
                            "summary": {"$ref": "#/components/schemas/End"}}}
HEALTH = {"type": "object", "required": ["status", "queue", "running"],
          "properties": {"status": {"enum": ["loading", "ok", "error", "stopping"]},
                         "loading": {"type": ["string", "null"], "description": "what the load is doing, until ok"},
                         "error": {"type": ["string", "null"], "description": "why the load failed (status error)"},
                         "queue": {"type": "integer", "minimum": 0},
                         "running": {"type": "boolean"}, "target": {"type": "string"},
                         "drafters": {"type": "array", "items": {"type": "string"}}}}
# each server-sent event: `data` is one JSON record (specview.events/1 plus `request`), `id` its number on /events
STREAM = {"text/event-stream": {"schema": {"type": "object", "required": ["data"], "properties": {
    "data": {"type": "string", "contentMediaType": "application/json"}, "id": {"type": "string"},
    "event": {"type": "string"}}}}}
WHY = {400: "a drafter this server did not load", 401: "missing or wrong Bearer token",
       413: "the body is larger than --max-body", 422: "malformed: the field is named",
       503: "the queue is full (Retry-After), the models are loading (Retry-After), their load failed, or the "
            "server is stopping"}


def _errors(*codes: int) -> dict:
    return {str(code): {"description": WHY[code],
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for code in codes}


def _request_schema(model, cap: int, drafters: list[str]) -> dict:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    props = schema["properties"]
    if "max_new_tokens" in props:  # the server's cap, a runtime setting
        props["max_new_tokens"]["anyOf"][0]["maximum"] = cap
    if "draft" in props:
        props["draft"]["anyOf"][0] = {"enum": drafters} if drafters else {"not": {}}
    return schema


def openapi_document(cap: int, drafters: list[str], token: bool) -> dict:
    auth = (401,) if token else ()
    body = {"required": True, "content": {"application/json": {"schema": {}}}}

    def post(name: str, ok: dict, summary: str) -> dict:
        request = {**body, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}
        return {"post": {"summary": summary, "requestBody": request,
                         "responses": {"200": ok, **_errors(400, *auth, 413, 422, 503)}}}

    def get(summary: str, ok: dict, parameters: list | None = None, public: bool = False) -> dict:
        op = {"summary": summary, "responses": {"200": ok, **_errors(*(() if public else auth))}}
        if parameters:
            op["parameters"] = parameters
        if public:
            op["security"] = []
        return {"get": op}

    generate_ok = {"description": "the generation, or with stream: true its records as server-sent events",
                   "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Generated"}}, **STREAM}}
    predict_ok = {"description": "the seed server's answer: prompt + continuation",
                  "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Predicted"}}}}
    last_id = {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string"},
               "description": "replay the kept records after this one"}
    health_ok = {"description": "status", "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}}
    health_op = get("ready to serve requests (200 only then); what it loaded", health_ok, public=True)
    health_op["get"]["responses"]["503"] = {**health_ok, "description": "loading (Retry-After), failed or stopping"}
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "specview serve", "version": "1",
                 "description": "Speculative decoding behind HTTP. Errors are JSON {error, field}."},
        "paths": {
            "/generate": post("GenerateRequest", generate_ok, "generate from a prompt"),
            "/predict": post("PredictRequest", predict_ok, "the seed project's endpoint"),
            "/health": health_op,
            "/live": get("is the process up (200 while loading too); what it loads", health_ok, public=True),
            "/metrics": get("Prometheus text", {"description": "metrics", "content": {"text/plain": {"schema": {
                "type": "string"}}}}),
            "/events": get("every record of every request", {"description": "server-sent events", "content": STREAM},
                           [last_id]),
            "/openapi.json": get("this document", {"description": "OpenAPI 3.1", "content": {
                "application/json": {"schema": {"type": "object"}}}}),
        },
        "components": {"schemas": {
            "GenerateRequest": _request_schema(GenerateRequest, cap, drafters),
            "PredictRequest": _request_schema(PredictRequest, cap, drafters),
            "Generated": GENERATED, "Predicted": PREDICTED, "End": END, "Health": HEALTH, "Error": ERROR}},
    }
    if token:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
