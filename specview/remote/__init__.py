"""Serving engines reached over HTTP (docs/guide/engines.md): llama.cpp's llama-server and vLLM behind their HTTP
endpoints. What kind of server a URL is, one completion request with the engine's own draft counters (llama-server's
per-request `timings`, or the deltas of the Prometheus counters around the request), and llama-server started on a
loopback port. No torch: `eval --endpoint` loads no model."""
