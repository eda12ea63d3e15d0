"""The one access decision: which model a tenant's requested name means, or "not found" (issue 42).

Every route that takes a model name (/v1/models, /v1/models/{id}, /tokenize,
/detokenize, /v1/chat/completions, /v1/completions) calls `resolve_model` and
nothing else, so no route can disagree with another (LiteLLM #8113: a list
filtered by access while inference still served the hidden model).

    access  = ModelAccess.parse(tenant_record.get("models"))   # missing field -> ALL ("*")
    catalog = Catalog.build(announcements, aliases={...})      # what the engines announce
    result  = resolve_model("chat", access, catalog, tenant_aliases={})
    if isinstance(result, ModelNotFound): -> 404, result.message (the same bytes for hidden and absent)
    elif not result.model.live:            -> 503 + Retry-After (registered, no live replica)
    else: route to result.model.id's replicas; report result.model.id as the response's model

Rules:
  * `*` (ALL) means every model and adapter and is stored and shown as "*";
    an empty list means none, never all (LiteLLM #26656, #28464).
  * Aliases (tenant first, then global) map a requested name to a served id;
    access is checked on the id that would serve, so an alias can never reach
    a model the tenant may not use. A name that is both an alias and an id
    means the alias (the operator wrote it to redirect).
  * LoRA adapters (issue 43) are model ids with a `parent`: an engine announces
    `adapters: [{"name": ..., "parent": base}]` and `Catalog.build` lists each as
    its own id, routed to the engines announcing it. Access to an adapter is
    its own entry in the list (or ALL): allowing a base does not allow its
    adapters, nor the reverse.
  * A model that is not allowed gets exactly the answer of one that does not
    exist, so a tenant cannot enumerate what others run.

Pure: no Redis, no HTTP, no clock. It knows nothing about replicas beyond the
ids they announce and whether any of them is live.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ALL = "*"
"""The stored and shown form of "every model"."""


@dataclass(frozen=True)
class ModelAccess:
    """A tenant's model list: every model (`allowed is None`, shown as "*") or exactly these ids."""

    allowed: frozenset[str] | None = None

    @staticmethod
    def parse(raw: str | None) -> ModelAccess:
        """The stored form: None (a tenant written before this field) and "*" are ALL; "" is none."""
        if raw is None or raw.strip() == ALL:
            return ModelAccess(None)
        return ModelAccess(frozenset(n for n in (p.strip() for p in raw.split(",")) if n))

    @staticmethod
    def of(names: Iterable[str]) -> ModelAccess:
        """From a list of names as an operator gives them ("*" among them means ALL)."""
        names = [n.strip() for n in names]
        if ALL in names:
            return ModelAccess(None)
        return ModelAccess(frozenset(n for n in names if n))

    @property
    def everything(self) -> bool:
        return self.allowed is None

    def encode(self) -> str:
        """"*", or the sorted ids joined by "," ("" for none)."""
        return ALL if self.allowed is None else ",".join(sorted(self.allowed))

    def shown(self) -> list[str]:
        """For admin output: ["*"] or the sorted ids ([] for none)."""
        return [ALL] if self.allowed is None else sorted(self.allowed)

    def permits(self, model_id: str) -> bool:
        return self.allowed is None or model_id in self.allowed


EVERY_MODEL = ModelAccess(None)


@dataclass(frozen=True)
class ServedModel:
    id: str
    """The name clients send and responses report (a base model's name, or an adapter's)."""
    parent: str | None = None
    """For an adapter: the base model it runs on (OpenAI's `parent` in the model object)."""
    live: bool = True
    """Some replica serving it answers now; registered but not live -> 503 with Retry-After."""
    max_model_len: int = 0
    """The smallest context among its live replicas (0 when unknown)."""


@dataclass(frozen=True)
class Announcement:
    """One engine's record as far as the catalog cares (shared/engine_registry.py's EngineRecord)."""

    model: str
    live: bool
    max_model_len: int = 0
    adapters: tuple[tuple[str, str], ...] = ()
    """(adapter name, parent base model) pairs; empty until the engine loads adapters."""


@dataclass(frozen=True)
class Catalog:
    """Every registered model id (base or adapter) and the operator's global aliases."""

    models: Mapping[str, ServedModel] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def build(announcements: Iterable[Announcement], aliases: Mapping[str, str] | None = None,
              registered: Iterable[str] = ()) -> Catalog:
        """Models from engine announcements: an id is live if any announcing engine is; `registered`
        adds ids seen before whose engines are all gone (so they get 503, not 404)."""
        live: dict[str, bool] = {name: False for name in registered}
        lengths: dict[str, list[int]] = {}
        parents: dict[str, str | None] = {name: None for name in registered}
        for a in announcements:
            for name, parent in ((a.model, None), *a.adapters):
                live[name] = live.get(name, False) or a.live
                parents[name] = parent
                if a.live and a.max_model_len:
                    lengths.setdefault(name, []).append(a.max_model_len)
        models = {name: ServedModel(name, parents.get(name), live[name], min(lengths.get(name, [0])))
                  for name in live}
        return Catalog(models, dict(aliases or {}))


@dataclass(frozen=True)
class Resolved:
    requested: str
    model: ServedModel


@dataclass(frozen=True)
class ModelNotFound:
    requested: str

    @property
    def message(self) -> str:
        # OpenAI's own wording; the same text whether the model is hidden or absent.
        return f"The model `{self.requested[:256]}` does not exist or you do not have access to it."


def resolve_model(requested: str, access: ModelAccess, catalog: Catalog,
                  tenant_aliases: Mapping[str, str] | None = None) -> Resolved | ModelNotFound:
    """The served model for `requested` as this tenant may use it, or ModelNotFound (never a hint why)."""
    target = (tenant_aliases or {}).get(requested) or catalog.aliases.get(requested) or requested
    model = catalog.models.get(target)
    if model is None or not access.permits(model.id):
        return ModelNotFound(requested)
    return Resolved(requested, model)


def visible_models(access: ModelAccess, catalog: Catalog) -> list[ServedModel]:
    """What /v1/models lists: exactly the ids `resolve_model` serves this tenant (aliases are not listed)."""
    found = (resolve_model(name, access, catalog) for name in sorted(catalog.models))
    return [r.model for r in found if isinstance(r, Resolved)]


def fallback_order(resolved: Resolved, fallbacks: Mapping[str, list[str]], access: ModelAccess,
                   catalog: Catalog, cooling: Iterable[str] = ()) -> list[ServedModel]:
    """The models to try, in order: the resolved one unless it is cooling down (recently failed), then
    its configured fallbacks that this tenant may use and that are live; never a hidden model. Empty:
    nothing can serve now (503 + Retry-After)."""
    cool = set(cooling)
    first = [resolved.model] if resolved.model.live and resolved.model.id not in cool else []
    rest = [r.model for r in (resolve_model(name, access, catalog) for name in fallbacks.get(resolved.model.id, []))
            if isinstance(r, Resolved) and r.model.live and r.model.id not in cool and r.model.id != resolved.model.id]
    return first + rest
