"""The OpenAI-compatible HTTP gateway: text in, token ids to the engine, text out as it is made.

A request's path through the package:

    server.py        `pageserve gateway`: flags + PAGESERVE_* twins -> GatewayConfig (config.py) -> uvicorn
    app.py           create_app(config): routes + a lifespan owning the services (state.py)
    routes.py        POST /v1/chat/completions, /v1/completions; GET /health; mounts the routes below
    responses_api.py POST /v1/responses: OpenAI's Responses API as a chat request, its typed stream events
    models_api.py    GET /v1/models, /v1/models/{model}: the models this tenant may use
    served_models.py the models behind the gateway: catalog, per-model tokenizers, aliases, cool-downs;
                     every route's model name goes through tenancy/model_access.py's one decision
    fallbacks.py     a generation's model, then its allowed fallbacks, before the first byte
    tokenize_api.py  POST /tokenize, /detokenize (vLLM's shapes)
    openapi.py       GET /openapi.json, generated from the request models
    auth.py          Bearer key verified before the body is read (recent_keys.py: hashes of keys verified
                     in the last seconds), then key + quota ticket in one Redis round trip at admission
    body.py          bytes -> JSON object: content type, size limit, strict JSON, or 4xx
    request_fields.py which top-level fields are honoured, refused unless neutral, or ignored (vLLM's policy)
    schemas.py       body checked field by field -> the sampling fields it set + stop strings, or 400 naming the param
    validation_errors.py  pydantic's errors -> a 400 naming the field (never its value)
    output_options.py  vLLM's prompt/text options (stop string kept, special tokens, bad_words, truncation,
                     echo, chat template options)
    response_format.py  response_format / structured_outputs / guided_* -> GrammarSpec (schema meta-checked)
    tools.py         tools + tool_choice -> ToolPlan (forced calls as a grammar); tools in tool-unaware templates
    tool_parser.py   the model's Hermes-format tool calls out of its text, streamed as argument deltas
    prompts.py       chat template + tokenization (tokenizer.py: tokenizers + jinja2, no torch)
    sampling_plan.py the one SamplingParams (max_tokens decided: the client's or the room left, the engine's
                     defaults filled in) and the output tokens admission reserves, decided together
    serving.py       token-id checks, admission, submit, then SSE (sse.py) or one JSON body;
                     settlement after the last byte
    generation.py    one request in flight: engine deltas -> text per choice (detokenizer.py,
                     stop_strings.py); the single close/settle
    openai_format.py the exact chunk/response JSON shapes
    prompt_echo.py   echo, prompt logprobs and token ids in those shapes (vLLM's)
    engine_link.py   keeps an EngineClient (engine_client.py; request_stream.py: one request's outputs,
                     engine_errors.py: what it raises) connected, reconnects after a loss, and
                     watches the engine's step counter (a stalled engine fails open streams)
    background_tasks.py  how the owners of background tasks (read loops, heartbeats, probes) stop them
    request_context.py  per request: x-request-id, access-log line, metrics, 503 while draining
    metrics.py       /metrics: prometheus-client (multiprocess) + the engine's Stats under vLLM names
    routing_metrics.py  the replica router's decisions and each replica's load on /metrics (pageserve:)
    ops_routes.py    GET /ready, /version, /metrics;  lifecycle.py: SIGTERM drain
    logging_setup.py text or JSON logs (python-json-logger)
    errors.py        4xx / 500 / 503 in OpenAI's error body
    lora_admin.py    POST /v1/load_lora_adapter, /v1/unload_lora_adapter: admin only, to every engine of the base
    lora_metrics.py  the engine's LoRA figures on /metrics (vllm:lora_requests_info, loads, evictions)
    tenancy/         tenants, hashed keys, quotas, admission, usage (admin_routes.py mounts /admin)

The gateway never imports torch, and the engine never sees text.
"""
