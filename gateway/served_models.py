"""The models behind this gateway as routes see them: the catalog, each model's tokenizer, fallbacks.

Every route that takes a model name asks `ServedModels.resolve` (which asks
gateway/tenancy/model_access.py's `resolve_model`, the one access decision):

    model  = served.resolve(requested, auth.models, state.engine)    # 404 model_not_found, 503 no replica
    tries  = served.candidates(model, auth.models, state.engine)     # it, then its allowed live fallbacks
    engine = served.engine_for(model.id, state.engine)               # that model's replicas only
    prompts = served.prompts_for(model)                              # its tokenizer (an adapter: its parent's)

The catalog comes from the engine source: the replica set's live replicas and
the models it has seen (registered: 503 when none is live), or the single
engine link's one model. Aliases are the operator's (`--model-alias A=B`), plus
each configured spec as an alias of the name its engine reports (what
`served_model_names` did for one model). A model whose engine failed a
request cools down for `cooldown_s`: it is skipped in favour of its fallbacks,
so a dead model is not retried on every request (LiteLLM #40405).
It knows nothing about HTTP bodies or Redis.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.config import ModelsConfig
from gateway.errors import EngineUnavailable, NotFound
from gateway.prompts import Prompts
from gateway.replicas.router import announced_adapters
from gateway.tenancy.model_access import (
    Announcement,
    Catalog,
    ModelAccess,
    ModelNotFound,
    ServedModel,
    fallback_order,
    resolve_model,
    visible_models,
)


class ServedModels:
    def __init__(self, prompts: Mapping[str, Prompts], config: ModelsConfig | None = None,
                 spec_aliases: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """prompts: served model id -> its tokenizer; spec_aliases: configured spec -> served id."""
        self.config = config or ModelsConfig()
        self._prompts = dict(prompts)
        self._aliases = {**{s: n for s, n in (spec_aliases or {}).items() if s != n}, **self.config.aliases}
        self._clock = clock
        self._cool_until: dict[str, float] = {}
        self._seen: dict[str, str | None] = {}

    # -- the catalog and the one decision ----------------------------------------------------------

    def catalog(self, engine: Any) -> Catalog:
        """From the engine source (duck-typed: ReplicaSet's `announcements`, else the single link)."""
        if hasattr(engine, "announcements"):
            announced = list(engine.announcements())
            registered = list(engine.registered)
        else:
            client = engine.client
            info = client.model_info if client is not None else None
            announced = [] if info is None else [Announcement(info.model_name, True, info.max_model_len,
                                                              announced_adapters(info))]
            registered = []
        bases = {a.model for a in announced}
        if len(self._prompts) == 1 and len(bases) == 1:  # one model (one engine or replicas): its spec names it
            spec, name = next(iter(self._prompts)), next(iter(bases))
            if spec != name:
                self._aliases.setdefault(spec, name)
        for a in announced:
            self._seen.setdefault(a.model, None)
            self._seen.update(dict(a.adapters))
        unloaded = self._unloaded(announced)
        # Configured models (--model) are registered too: with no live engine they answer 503, not 404.
        configured = [n for n in self._prompts if n not in self._aliases]
        known = [n for n in [*registered, *self._seen] if n not in unloaded]
        return Catalog.build(announced, self._aliases, [*known, *configured])

    def _unloaded(self, announced: list[Announcement]) -> set[str]:
        """Adapters seen before that no engine announces although their base model is live: unloaded by
        the admin (gateway/lora_admin.py), so a 404 like any absent model, not a 503 waiting for a replica."""
        live_bases = {a.model for a in announced if a.live}
        current = {name for a in announced for name, _ in a.adapters}
        return {name for name, parent in self._seen.items()
                if parent is not None and parent in live_bases and name not in current}

    def resolve(self, requested: str, access: ModelAccess, engine: Any,
                tenant_aliases: tuple[tuple[str, str], ...] = ()) -> ServedModel:
        """The served model, or a 404 (never registered, or not allowed: the same body); `.live` False: the
        caller answers 503. `tenant_aliases` (the caller's own) apply before the global ones."""
        found = resolve_model(requested, access, self.catalog(engine), dict(tenant_aliases))
        if isinstance(found, ModelNotFound):
            raise NotFound(found.message, param="model", code="model_not_found")
        return found.model

    def listed(self, access: ModelAccess, engine: Any) -> list[ServedModel]:
        """/v1/models: the ids `resolve` would serve this tenant."""
        return visible_models(access, self.catalog(engine))

    def candidates(self, model: ServedModel, access: ModelAccess, engine: Any) -> list[ServedModel]:
        """`model` (unless dead or cooling), then its allowed live fallbacks; a 503 when none is left."""
        catalog = self.catalog(engine)
        now = self._clock()
        cooling = [m for m, until in self._cool_until.items() if until > now]
        found = resolve_model(model.id, access, catalog)
        tries = [] if isinstance(found, ModelNotFound) else fallback_order(
            found, {k: list(v) for k, v in self.config.fallbacks.items()}, access, catalog, cooling)
        if not tries and model.live and model.id in cooling and not self.config.fallbacks.get(model.id):
            tries = [model]  # no fallback configured: cooling only reorders, it never refuses on its own
        if not tries:
            raise EngineUnavailable(f"the model {model.id!r} has no live engine replica; retry shortly",
                                    code="model_unavailable")
        return tries

    def recheck(self, requested: str, model_id: str, access: ModelAccess, engine: Any) -> None:
        """After admission, with the model list admission read: still allowed, else the same 404 as `resolve`."""
        if isinstance(resolve_model(model_id, access, self.catalog(engine)), ModelNotFound):
            raise NotFound(ModelNotFound(requested).message, param="model", code="model_not_found")

    @staticmethod
    def require_live(model: ServedModel) -> None:
        if not model.live:
            raise EngineUnavailable(f"the model {model.id!r} has no live engine replica; retry shortly",
                                    code="model_unavailable")

    def failed(self, model_id: str) -> None:
        """The model's engine failed before any byte was sent: pass it over for `cooldown_s`."""
        self._cool_until[model_id] = self._clock() + self.config.cooldown_s

    # -- per model: tokenizer and engine ---------------------------------------------------------------

    def prompts_for(self, model: ServedModel) -> Prompts:
        """The model's tokenizer; an adapter uses its parent's."""
        prompts = self._prompts.get(model.id) or self._prompts.get(model.parent or "")
        if prompts is None:
            if len(self._prompts) == 1:  # one model configured: today's behaviour, whatever the engine's name
                return next(iter(self._prompts.values()))
            raise EngineUnavailable(f"this gateway has no tokenizer for {model.id!r}: start it with "
                                    "--model for each served model", code="model_unavailable")
        return prompts

    def engine_for(self, model_id: str, engine: Any) -> Any:
        """The engine handle whose requests reach only `model_id`'s replicas (503 when none is live)."""
        client = engine.client
        if client is None:
            raise EngineUnavailable("the engine is not reachable; retry shortly", code="engine_unavailable")
        return client.for_model(model_id) if hasattr(client, "for_model") else client
