"""engine/worker/sampler.py alone: greedy, seeds, top-k, top-p, min_tokens, generator lifetime."""

from __future__ import annotations

import pytest
import torch

from engine.outputs import ScheduledChunk
from engine.worker.logits_processors import mask_min_tokens
from engine.worker.sampler import Sampler
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec

V = 50


def chunk(rid: str, n_out: int = 0, eos: int | None = 2, grammar: GrammarSpec | None = None,
          **params: object) -> ScheduledChunk:
    return ScheduledChunk(rid, [7], 10, [0], True, SamplingParams(max_tokens=100, **params), n_out, eos,  # type: ignore[arg-type]
                          grammar=grammar)


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_take_the_argmax() -> None:
    lg = logits(3)
    rows = [chunk("a", temperature=0.0), chunk("b", temperature=0.0), chunk("c", temperature=0.0)]
    assert Sampler().sample(lg.clone(), rows) == lg.argmax(-1).tolist()


def test_same_seed_same_tokens_whatever_the_batch() -> None:
    """A seeded request draws the same tokens alone or beside others, in any row."""
    lg = logits(4, seed=1)
    alone, crowded = Sampler(), Sampler(seed=99)
    got_alone = [alone.sample(lg[2:3].clone(), [chunk("x", seed=7)])[0] for _ in range(20)]
    got_crowded = []
    for _ in range(20):
        rows = [chunk("o1"), chunk("g", temperature=0.0), chunk("x2", seed=7), chunk("o2", top_k=5)]
        got_crowded.append(crowded.sample(lg.clone(), rows)[2])
    assert got_alone == got_crowded
    assert len(set(got_alone)) > 1  # it really samples


def test_different_seeds_differ_and_unseeded_requests_differ() -> None:
    lg = logits(1, seed=2)
    s = Sampler()
    a = [s.sample(lg.clone(), [chunk("a", seed=1)])[0] for _ in range(30)]
    b = [s.sample(lg.clone(), [chunk("b", seed=2)])[0] for _ in range(30)]
    c = [s.sample(lg.clone(), [chunk("c")])[0] for _ in range(30)]
    d = [s.sample(lg.clone(), [chunk("d")])[0] for _ in range(30)]
    assert a != b and c != d


def test_top_k_draws_only_among_the_k_best() -> None:
    lg = logits(1, seed=3)
    top3 = set(lg[0].topk(3).indices.tolist())
    s = Sampler()
    drawn = {s.sample(lg.clone(), [chunk("k", temperature=2.0, top_k=3)])[0] for _ in range(200)}
    assert drawn == top3  # all three reachable at high temperature, nothing else
    assert s.sample(lg.clone(), [chunk("k1", top_k=1)])[0] == int(lg[0].argmax())


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    lg = torch.full((1, V), -30.0)
    lg[0, [4, 9, 11]] = torch.tensor([2.0, 1.0, 0.0]).log_softmax(0) + 10  # probs ~0.665, 0.245, 0.090
    s = Sampler()
    drawn = {s.sample(lg.clone(), [chunk("p", top_p=0.8)])[0] for _ in range(300)}
    assert drawn == {4, 9}  # 0.665 < 0.8, so the second is needed; the third is not
    assert {s.sample(lg.clone(), [chunk("q", top_p=0.5)])[0] for _ in range(50)} == {4}


def test_sampled_frequencies_follow_the_distribution() -> None:
    lg = torch.tensor([[0.0, 1.0, 2.0]]).log()  # probs 0, 1/3, 2/3
    s = Sampler()
    draws = torch.tensor([s.sample(lg.clone(), [chunk("f", seed=5)])[0] for _ in range(600)])
    assert (draws == 0).sum() == 0
    assert 0.58 < float((draws == 2).float().mean()) < 0.75


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_masks_eos_and_stop_ids(temperature: float) -> None:
    lg = torch.zeros(1, V)
    lg[0, 2], lg[0, 5], lg[0, 8] = 50.0, 49.0, 48.0  # eos best, then a stop id, then token 8
    s = Sampler()
    early = chunk("m", n_out=1, eos=2, temperature=temperature, min_tokens=3, stop_token_ids=(5,))
    assert s.sample(lg.clone(), [early])[0] == 8
    done = chunk("m2", n_out=3, eos=2, temperature=0.0, min_tokens=3, stop_token_ids=(5,))
    assert s.sample(lg.clone(), [done])[0] == 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_never_empties_a_row_its_grammar_ended(temperature: float) -> None:
    """Issue 17: a complete grammar allows only EOS; min_tokens must not mask that too (the grammar wins)."""
    grammar = GrammarSpec("choice", '["ab"]')
    lg = torch.full((4, V), float("-inf"))
    lg[0, 2] = lg[3, 2] = 1.0  # rows 0, 3: a grammar that allows only EOS
    lg[1, 2] = lg[1, 9] = 1.0  # row 1: a grammar that allows EOS or token 9
    lg[2] = logits(1)[0]       # row 2: unconstrained
    lg[2, 2] = 50.0
    rows = [chunk("done", n_out=2, temperature=temperature, min_tokens=8, grammar=grammar),
            chunk("open", n_out=2, temperature=temperature, min_tokens=8, grammar=grammar),
            chunk("free", n_out=2, temperature=temperature, min_tokens=8),
            chunk("done-stop-id", n_out=2, temperature=temperature, min_tokens=8, stop_token_ids=(2, 4),
                  grammar=grammar)]
    masked = lg.clone()
    mask_min_tokens(masked, rows)
    assert torch.isfinite(masked).any(dim=-1).all()
    assert not torch.softmax(masked, dim=-1).isnan().any()
    assert masked[1, 2] == masked[2, 2] == float("-inf") and masked[3, 4] == float("-inf")
    tokens = Sampler().sample(lg.clone(), rows)
    assert tokens[0] == tokens[3] == 2 and tokens[1] == 9 and tokens[2] != 2


def test_finished_requests_drop_their_generators() -> None:
    s = Sampler()
    s.sample(logits(2), [chunk("a"), chunk("b", seed=1)])
    assert s.num_generators == 2
    s.forget(["a", "b", "never-seen"])
    assert s.num_generators == 0
