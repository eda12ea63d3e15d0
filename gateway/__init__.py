"""The OpenAI-compatible HTTP gateway: text in, token ids to the engine, text out as it is made.

A request's path through the package:

    server.py        `pageserve gateway`: flags/env -> GatewayConfig (config.py) -> uvicorn
    app.py           create_app(config): routes + a lifespan owning the services (state.py)
    routes.py        POST /v1/chat/completions, /v1/completions; GET /v1/models, /health
    auth.py          Bearer key -> AuthContext + quota ticket in one Redis round trip (keys only as hashes),
                     or 401 before any other refusal
    schemas.py       body checked field by field -> SamplingParams + stop strings, or 400 naming the param
    response_format.py  response_format / structured_outputs / guided_* -> GrammarSpec (schema meta-checked)
    tools.py         tools + tool_choice -> ToolPlan (forced calls as a grammar); tools in tool-unaware templates
    tool_parser.py   the model's Hermes-format tool calls out of its text, streamed as argument deltas
    prompts.py       chat template + tokenization (tokenizer.py: tokenizers + jinja2, no torch)
    serving.py       context check, admission, submit, then SSE (sse.py) or one JSON body;
                     settlement after the last byte
    generation.py    one request in flight: engine deltas -> text per choice (detokenizer.py,
                     stop_strings.py); the single close/settle
    openai_format.py the exact chunk/response JSON shapes
    engine_link.py   keeps an EngineClient (engine_client.py) connected, reconnects after a loss
    errors.py        4xx / 500 / 503 in OpenAI's error body
    tenancy/         tenants, hashed keys, quotas, admission, usage (admin_routes.py mounts /admin)

The gateway never imports torch, and the engine never sees text.
"""
