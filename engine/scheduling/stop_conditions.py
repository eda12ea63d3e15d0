"""When a request stops: the one place that turns a sampled token into a finish reason.

Stop tokens (EOS unless ignore_eos, and stop_token_ids) are honoured only once more
than min_tokens tokens were generated (the sampler also masks them before that);
then max_tokens and the model's context end the request with "length".

A constrained request (a grammar) is the exception: the sampler lets a stop token through
before min_tokens only when the grammar allows nothing else (the grammar wins,
engine/worker/logits_processors.py), and such a token ends the request with "stop".
"""

from __future__ import annotations

from engine.request import Request, RequestStatus


def finish_status(req: Request, max_model_len: int) -> RequestStatus | None:
    params, n_out = req.sampling, req.num_output_tokens
    if n_out == 0:
        return None
    last = req.output_token_ids[-1]
    if n_out > params.min_tokens or req.grammar is not None:
        if last in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if not params.ignore_eos and req.eos_token_id is not None and last == req.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
    if n_out >= params.max_tokens or req.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def finish_status_after(req: Request, token: int, max_model_len: int) -> RequestStatus | None:
    """The finish appending `token` would reach: beam search judges every candidate before it
    picks the beams (engine/scheduling/beam_group.py), so one rule decides both."""
    req.output_token_ids.append(token)
    try:
        return finish_status(req, max_model_len)
    finally:
        req.output_token_ids.pop()
