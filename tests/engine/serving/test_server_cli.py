"""`pageserve engine` flags become the frozen EngineConfig parts (no model is loaded here)."""

from __future__ import annotations

import pytest

from engine.config import GiB
from engine.serving.core_factory import engine_config
from engine.serving.main import build_parser


def test_flags_map_onto_each_components_config() -> None:
    args = build_parser().parse_args([
        "--model", "/models/x", "--dtype", "bfloat16", "--max-model-len", "4096", "--block-size", "32",
        "--kv-cache-memory", "1.5", "--swap-space", "0.25", "--num-blocks", "100", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "512", "--no-prefix-caching", "--attention-backend", "torch",
        "--default-sampling", '{"temperature": 0.7}',
    ])
    config = engine_config(args)
    assert (config.model.model, config.model.dtype, config.model.max_model_len) == ("/models/x", "bfloat16", 4096)
    assert (config.cache.block_size, config.cache.num_device_blocks) == (32, 100)
    assert config.cache.kv_cache_memory == int(1.5 * GiB) and config.cache.swap_space == GiB // 4
    assert (config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens) == (8, 512)
    assert config.scheduler.enable_prefix_caching is False and config.attention_backend == "torch"
    assert config.default_sampling == '{"temperature": 0.7}'  # the core resolves it into its ModelInfo


def test_defaults_are_the_components_defaults() -> None:
    config = engine_config(build_parser().parse_args([]))
    assert config.model.model == "smollm2" and config.model.max_model_len is None
    assert config.model.dtype == "auto"  # resolved at load: bfloat16 where the hardware has it
    # the engine process serves: while streams generate, a step carrying prompt tokens may take at most
    # 2x a decode-only step as measured (engine/scheduling/step_cost.py), and at most 256 prompt tokens
    assert config.scheduler.max_prefill_tokens_while_decoding == 256
    assert config.scheduler.prefill_stall_factor == 2.0
    # ... and while prompt tokens wait, steps carry enough of them to drain the backlog within 0.1 s
    assert config.scheduler.prefill_backlog_drain_s == 0.1
    assert engine_config(build_parser().parse_args(["--prefill-backlog-drain", "0"])).scheduler.prefill_backlog_drain_s == 0
    assert config.scheduler.enable_prefix_caching is True and config.cache.num_device_blocks is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--block-size", "0"], "block_size must be positive"),
        (["--max-num-seqs", "0"], "max_num_seqs must be at least 1"),
        (["--num-blocks", "0"], "num_device_blocks must be positive"),
        (["--kv-cache-memory", "-1"], "memory budgets must be non-negative"),
    ],
)
def test_out_of_range_flags_are_a_clear_value_error(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine_config(build_parser().parse_args(argv))


def test_scheduling_policy_flags_reach_the_scheduler_config() -> None:
    args = build_parser().parse_args([
        "--policy", "fcfs", "--preemption-mode", "swap", "--preemption-priority-gap", "3", "--aging-rate", "0.5",
    ])
    s = engine_config(args).scheduler
    assert (s.policy, s.preemption_mode, s.preemption_priority_gap, s.aging_rate) == ("fcfs", "swap", 3, 0.5)


def test_defaults_match_the_scheduler_config_defaults() -> None:
    from engine.scheduling.config import SchedulerConfig

    s, d = engine_config(build_parser().parse_args([])).scheduler, SchedulerConfig()
    assert (s.policy, s.preemption_mode, s.preemption_priority_gap, s.aging_rate) == (
        d.policy, d.preemption_mode, d.preemption_priority_gap, d.aging_rate)


def test_tensor_parallel_size_flag_defaults_to_one() -> None:
    assert engine_config(build_parser().parse_args([])).tensor_parallel_size == 1
    args = build_parser().parse_args(["--tensor-parallel-size", "2"])
    assert engine_config(args).tensor_parallel_size == 2


def test_the_serving_loop_starts_with_the_start_up_objects_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full collection of torch's and the model's objects stalled a step 86 ms: main freezes them first."""
    import gc

    from engine.serving import core_factory
    from engine.serving import main as engine_main
    from tests.engine.serving.fake_core import INFO, FakeCore

    core = FakeCore()
    core.model_info = INFO  # type: ignore[attr-defined]
    monkeypatch.setattr(core_factory, "build_core", lambda args: core)
    frozen_at_start: list[int] = []
    serve = engine_main.EngineServer.serve

    def serve_once(server: engine_main.EngineServer) -> int:
        frozen_at_start.append(gc.get_freeze_count())
        server.request_stop()
        return serve(server)

    monkeypatch.setattr(engine_main.EngineServer, "serve", serve_once)
    gc.unfreeze()
    try:
        assert engine_main.main(["--listen", "tcp://127.0.0.1:*"]) == 0
    finally:
        gc.unfreeze()
    assert frozen_at_start and frozen_at_start[0] > 0
