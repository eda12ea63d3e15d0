"""The one access decision (gateway/tenancy/model_access.py): pure, so every rule is a small example."""

from __future__ import annotations

from gateway.tenancy.model_access import (
    ALL,
    Announcement,
    Catalog,
    ModelAccess,
    ModelNotFound,
    Resolved,
    fallback_order,
    resolve_model,
    visible_models,
)

CATALOG = Catalog.build(
    [Announcement("smollm2", live=True, max_model_len=2048, adapters=(("sql-lora", "smollm2"),)),
     Announcement("tiny-llama", live=True, max_model_len=512),
     Announcement("tiny-llama", live=False, max_model_len=256)],
    aliases={"chat": "smollm2", "big": "tiny-llama"}, registered=["gone"])


def test_missing_field_and_star_mean_all_and_are_stored_as_star():
    for raw in (None, "*", " * "):
        access = ModelAccess.parse(raw)
        assert access.everything and access.encode() == ALL and access.shown() == ["*"]
    assert ModelAccess.of(["a", "*"]).everything
    assert {m.id for m in visible_models(ModelAccess.parse(None), CATALOG)} == {
        "smollm2", "sql-lora", "tiny-llama", "gone"}


def test_an_empty_list_means_no_model_never_all():
    for access in (ModelAccess.parse(""), ModelAccess.of([]), ModelAccess.of(["", " "])):
        assert not access.everything and access.encode() == "" and access.shown() == []
        assert visible_models(access, CATALOG) == []
        assert isinstance(resolve_model("smollm2", access, CATALOG), ModelNotFound)


def test_a_list_round_trips_sorted():
    access = ModelAccess.of(["tiny-llama", "smollm2"])
    assert access.encode() == "smollm2,tiny-llama" and ModelAccess.parse(access.encode()) == access


def test_not_allowed_reads_byte_for_byte_like_not_existing():
    only_small = ModelAccess.of(["smollm2"])
    hidden = resolve_model("tiny-llama", only_small, CATALOG)
    absent = resolve_model("tiny-llama", ModelAccess.of(["smollm2"]), Catalog.build([]))
    assert isinstance(hidden, ModelNotFound) and isinstance(absent, ModelNotFound)
    assert hidden == absent and hidden.message == absent.message
    assert hidden.message == "The model `tiny-llama` does not exist or you do not have access to it."
    assert [m.id for m in visible_models(only_small, CATALOG)] == ["smollm2"]


def test_an_alias_resolves_to_the_served_id_and_never_past_access():
    result = resolve_model("chat", ModelAccess.of(["smollm2"]), CATALOG)
    assert isinstance(result, Resolved) and result.model.id == "smollm2" and result.requested == "chat"
    assert isinstance(resolve_model("big", ModelAccess.of(["smollm2"]), CATALOG), ModelNotFound)
    # the tenant's alias wins over the global one
    mine = resolve_model("chat", EVERY, CATALOG, tenant_aliases={"chat": "tiny-llama"})
    assert isinstance(mine, Resolved) and mine.model.id == "tiny-llama"
    assert "chat" not in {m.id for m in visible_models(EVERY, CATALOG)}


EVERY = ModelAccess.parse("*")


def test_an_adapter_is_its_own_id_with_its_parent_and_its_own_permission():
    result = resolve_model("sql-lora", ModelAccess.of(["sql-lora"]), CATALOG)
    assert isinstance(result, Resolved) and result.model.parent == "smollm2" and result.model.live
    assert isinstance(resolve_model("sql-lora", ModelAccess.of(["smollm2"]), CATALOG), ModelNotFound)
    assert CATALOG.models["smollm2"].parent is None


def test_liveness_and_context_come_from_the_live_announcements():
    assert CATALOG.models["tiny-llama"].live and CATALOG.models["tiny-llama"].max_model_len == 512
    gone = resolve_model("gone", EVERY, CATALOG)
    assert isinstance(gone, Resolved) and not gone.model.live  # registered: 503, not 404


def test_fallbacks_skip_hidden_dead_and_cooling_models():
    fallbacks = {"tiny-llama": ["gone", "smollm2"], "smollm2": ["tiny-llama"]}
    first = resolve_model("tiny-llama", EVERY, CATALOG)
    assert isinstance(first, Resolved)
    assert [m.id for m in fallback_order(first, fallbacks, EVERY, CATALOG)] == ["tiny-llama", "smollm2"]
    assert [m.id for m in fallback_order(first, fallbacks, EVERY, CATALOG, cooling=["tiny-llama"])] == ["smollm2"]
    only_tiny = ModelAccess.of(["tiny-llama"])
    assert [m.id for m in fallback_order(first, fallbacks, only_tiny, CATALOG, cooling=["tiny-llama"])] == []
