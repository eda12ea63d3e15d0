"""Prompt log probabilities (vLLM's prompt_logprobs, completions' echo + logprobs) from the prompt's own step.

    prompt   t0  t1  t2  t3  t4            row p of a prompt chunk predicts token p + 1:
    rows     r0  r1  r2  r3  (r4 samples)  logprob(t[p+1] | t[..p]) = log_softmax(lm_head(h_p))[t[p+1]]

No second pass: engine/worker/input_batch.py adds the rows of requests that asked to the step's
lm_head rows (after the sampled ones), so the same forward that fills the KV cache gives them; a
prompt split over several chunks is gathered here, keyed by position, and handed out once, on the
step that reaches the prompt's end. The distribution is the raw one (as `logprobs`).

Prefix caching: a cached prefix has no hidden states, so a request that asks for prompt logprobs
never reads the prefix cache (engine/scheduling/block_manager.py find_prefix; vLLM's rule too); its
blocks are still cached for later requests. A preempted request recomputed later is not
reported twice. The values are read back to the host once per asking request per step (a sync only
those steps pay). Knows nothing about tokenizers or the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from engine.worker.input_batch import PromptRows
from shared.protocol import TokenLogprob


class PromptLogprobs:
    def __init__(self) -> None:
        self._partial: dict[str, dict[int, TokenLogprob]] = {}
        self._done: set[str] = set()

    def collect(self, logits: torch.Tensor, rows: list[PromptRows]) -> dict[str, list[TokenLogprob]]:
        """logits (P, V) float32 of the step's prompt rows, in `rows` order -> the requests whose
        prompt ended this step: their logprobs for prompt positions 1 .. L-1."""
        done: dict[str, list[TokenLogprob]] = {}
        at = 0
        for r in rows:
            c = r.chunk
            part = logits[at : at + r.count]  # (count, V)
            at += r.count
            if c.request_id in self._done:
                continue  # recomputed after a preemption: already reported
            k = c.sampling.prompt_logprobs or 0
            lp = torch.log_softmax(part.float(), dim=-1)  # (count, V)
            targets = torch.tensor(c.prompt_token_ids[r.first : r.first + r.count], dtype=torch.long,
                                   device=lp.device)
            own = lp.gather(1, targets[:, None]).squeeze(1).tolist()  # (count,)
            top_values, top_ids = lp.topk(k, dim=-1)  # (count, k)
            store = self._partial.setdefault(c.request_id, {})
            for j, (v, ids, vals) in enumerate(zip(own, top_ids.tolist(), top_values.tolist(), strict=True)):
                store[r.first + j] = TokenLogprob(v, ids, vals)
        for r in rows:
            c = r.chunk
            end = len(c.prompt_token_ids)
            if c.request_id not in self._done and r.first + r.count >= end:
                store = self._partial.pop(c.request_id, {})
                done[c.request_id] = [store[p] for p in range(1, end)]
                self._done.add(c.request_id)
        return done

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._partial.pop(rid, None)
            self._done.discard(rid)
