"""engine/worker/sampler.py with the OpenAI features: logprobs, logit_bias, penalties, min_p, processors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.outputs import ScheduledChunk
from engine.worker.sampler import Sampler
from shared.sampling import SamplingParams

V = 40


def chunk(rid: str, output: list[int] | None = None, **params: Any) -> ScheduledChunk:
    output = output or []
    return ScheduledChunk(rid, [7], 10, [0], True, SamplingParams(max_tokens=100, **params), len(output), 2,
                          [1, 7, 9], output)


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_logprobs_are_the_raw_distribution_of_the_asking_rows_only() -> None:
    lg = logits(3)
    raw = lg.log_softmax(-1)
    rows = [chunk("a", temperature=0.0, logprobs=5, frequency_penalty=2.0, output=[int(lg[0].argmax())]),
            chunk("b"), chunk("c", temperature=1.5, logprobs=0, logit_bias=((3, 50.0),))]
    out = Sampler().sample_with_logprobs(lg.clone(), rows)
    assert sorted(out.logprobs) == [0, 2]  # b did not ask
    a, c = out.logprobs[0], out.logprobs[2]
    assert a.top_token_ids == raw[0].topk(5).indices.tolist()
    torch.testing.assert_close(torch.tensor(a.top_logprobs), raw[0].topk(5).values)
    # Raw: before the penalty that changed the choice and before the bias that forced c's token.
    assert a.logprob == float(raw[0, out.token_ids[0]]) and out.token_ids[0] != int(lg[0].argmax())
    assert out.token_ids[2] == 3 and c.logprob == float(raw[2, 3])
    assert c.top_token_ids == [] and c.top_logprobs == []


def test_logit_bias_forces_and_bans_tokens() -> None:
    lg = logits(2, seed=1)
    s = Sampler()
    forced = [chunk("g", temperature=0.0, logit_bias=((11, 100.0),)), chunk("t", temperature=1.0, logit_bias=((11, 100.0),))]
    assert s.sample(lg.clone(), forced) == [11, 11]
    best = int(lg[0].argmax())
    banned = s.sample(lg[:1].clone(), [chunk("b", temperature=0.0, logit_bias=((best, -100.0),))])[0]
    assert banned != best


def test_frequency_penalty_steers_away_from_repeats_greedily() -> None:
    lg = torch.zeros(1, V)
    lg[0, 5], lg[0, 6] = 2.0, 1.5
    s = Sampler()
    assert s.sample(lg.clone(), [chunk("f", temperature=0.0, output=[5])])[0] == 5
    assert s.sample(lg.clone(), [chunk("f", temperature=0.0, output=[5], frequency_penalty=1.0)])[0] == 6
    assert s.sample(lg.clone(), [chunk("r", temperature=0.0, output=[5], repetition_penalty=1.5)])[0] == 6


def test_min_p_draws_only_tokens_above_the_floor() -> None:
    lg = torch.full((1, V), -20.0)
    lg[0, [4, 9, 11]] = torch.tensor([0.6, 0.3, 0.1]).log()
    s = Sampler()
    drawn = {s.sample(lg.clone(), [chunk("m", min_p=0.4)])[0] for _ in range(300)}
    assert drawn == {4, 9}  # 0.1 < 0.4 * 0.6


def test_seeded_rows_with_features_draw_the_same_tokens_whatever_the_batch() -> None:
    lg = logits(4, seed=2)
    mine = {"seed": 11, "presence_penalty": 0.5, "repetition_penalty": 1.2, "min_p": 0.02, "logprobs": 2}
    alone, crowded = Sampler(), Sampler(seed=5)
    got_alone = [alone.sample(lg[1:2].clone(), [chunk("x", output=[3, 3], **mine)])[0] for _ in range(20)]
    got_crowded = []
    for _ in range(20):
        rows = [chunk("o", temperature=0.0, logit_bias=((2, 9.0),)), chunk("x2", output=[3, 3], **mine),
                chunk("p", top_k=3, frequency_penalty=1.0, output=[1]), chunk("q", logprobs=20)]
        got_crowded.append(crowded.sample(lg.clone(), rows)[1])
    assert got_alone == got_crowded
    assert len(set(got_alone)) > 1  # it really samples


def test_processors_run_first_on_the_rows_they_own() -> None:
    """The per-row mask hook (a grammar's bitmask): applied before logprobs and every other transform."""

    def allow_only_7_on_constrained(lg: torch.Tensor, rows: Sequence[ScheduledChunk]) -> None:
        for i, c in enumerate(rows):
            if c.request_id.startswith("constrained"):
                keep = lg[i, 7].clone()
                lg[i].fill_(float("-inf"))
                lg[i, 7] = keep

    s = Sampler(processors=[allow_only_7_on_constrained])
    lg = logits(2, seed=3)
    out = s.sample_with_logprobs(lg.clone(), [chunk("constrained", logprobs=1), chunk("free", temperature=0.0)])
    assert out.token_ids == [7, int(lg[1].argmax())]
    assert out.logprobs[0].logprob == 0.0 and out.logprobs[0].top_token_ids == [7]
