"""A generation request's model choice: the resolved model, then its fallbacks, before the first byte.

    model = served.resolve(settings.model, auth.models, engine)      # 404 / the one access decision
    for each of served.candidates(model, ...):                        # dead or cooling models skipped
        tokenize with its tokenizer, plan (a context too short -> next)
        serve: admit (tenant + key + tenant-on-model quotas), submit
            engine unavailable at submit -> the model cools down, next

A fallback is taken only while nothing was sent to the client: once `serve`
returns, the response (and failover between one model's replicas,
gateway/replicas/failover.py) is the only path. Only models the tenant may
use are candidates (model_access.fallback_order). A try refused by the engine
is settled with nothing charged but its request count, and the next model is
admitted on its own. It knows nothing about OpenAI's JSON shapes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.types import ASGIApp

from gateway.errors import APIError, EngineUnavailable
from gateway.openai_format import Endpoint
from gateway.prompts import Prompts
from gateway.schemas import GenerationSettings
from gateway.serving import PromptInput, Responder, plan, serve
from gateway.state import GatewayState
from gateway.tenancy.store import AuthContext

MakePrompt = Callable[[Prompts], Awaitable[PromptInput]]
"""The route's tokenization of its body with one model's tokenizer."""
MakeResponder = Callable[[str], Responder]
"""Another response shape (/v1/responses) for the served model's name."""


async def serve_model(request: Request, state: GatewayState, endpoint: Endpoint, settings: GenerationSettings,
                      make_prompt: MakePrompt, auth: AuthContext, key: str,
                      responder: MakeResponder | None = None) -> ASGIApp:
    served = state.models
    model = served.resolve(settings.model, auth.models, state.engine, auth.aliases)
    last: APIError | None = None
    for candidate in served.candidates(model, auth.models, state.engine):
        prompts = served.prompts_for(candidate)
        prompts.check_vocab(list(settings.stop_token_ids), "stop_token_ids")
        prompt = await make_prompt(prompts)
        try:
            planned = plan(state, endpoint, settings, prompt, candidate.id, prompts)
        except APIError as e:
            if e.code != "context_length_exceeded":
                raise
            last = e  # too long for this model: a fallback with a longer context may take it
            continue
        try:
            shape = None if responder is None else responder(planned.engine.model_info.model_name)
            return await serve(request, state, planned, key, shape)
        except EngineUnavailable as e:
            served.failed(candidate.id)
            last = e
    assert last is not None, "candidates() is never empty"
    raise last
