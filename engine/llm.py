"""The offline API: `LLM(model=...).generate(prompts, params)`, in-process, no server.

    llm = LLM(model="smollm2", dtype="float32")          # device="cuda" for a GPU
    results = llm.generate(["Hello", [1, 2, 3]], SamplingParams(max_tokens=32, temperature=0))
    results[0].text, results[0].token_ids, results[0].finish_reason
    beams = llm.beam_search(["Hello"], BeamSearchParams(beam_width=4, max_tokens=16))
    beams[0].outputs[0].text                               # the best beam; outputs are best first

Prompts are strings (tokenized here) or token-id lists; results come back in
prompt order. This wrapper owns the tokenizer; the EngineCore below it sees
token ids only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import CacheConfig, EngineConfig, LoraConfig, ModelConfig
from engine.core import EngineCore
from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from shared.model_info import ModelInfo
from shared.protocol import TokenLogprob
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec

Prompt = str | list[int]


@dataclass
class SampleOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per token when SamplingParams.logprobs was set (the raw distribution, vLLM's default)."""


@dataclass
class GenerationResult:
    """One prompt's outputs: `outputs[i]` is sample i (n > 1); the properties read sample 0."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[SampleOutput]
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    """With SamplingParams.prompt_logprobs: prompt tokens 1.. (the first has none), raw distribution."""

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's offline beam search parameters (plus transformers' early_stopping): `beam_width`
    beams are kept each step and all of them returned, best first."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    """Only 0: the beams are ranked by the raw model distribution."""
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def sampling(self) -> SamplingParams:
        return SamplingParams(n=self.beam_width, use_beam_search=True, max_tokens=self.max_tokens,
                              ignore_eos=self.ignore_eos, temperature=self.temperature,
                              length_penalty=self.length_penalty, early_stopping=self.early_stopping)


class LLM:
    def __init__(
        self,
        model: str = "smollm2",
        dtype: str = "auto",
        *,
        max_model_len: int | None = None,
        block_size: int = 16,
        kv_cache_memory: int | None = None,
        num_device_blocks: int | None = None,
        num_cpu_blocks: int | None = None,
        scheduler: SchedulerConfig | None = None,
        attention_backend: str = "auto",
        seed: int = 0,
        device: str = "cpu",
        enforce_eager: bool = False,
        tensor_parallel_size: int = 1,
        lora: LoraConfig | None = None,
    ) -> None:
        """`device`: where the weights and the KV cache live ("cpu", "cuda", "cuda:1"); "auto"
        attention then picks the Triton kernels on CUDA and the CPU kernels elsewhere.
        `enforce_eager`: decode steps through the Python layers (no CUDA graphs, no C++ layer loop on CPUs).
        `tensor_parallel_size`: processes sharing every layer (engine/worker/parallel/); `close()` stops them.
        `lora`: LoRA adapters (LoraConfig(enabled=True, modules=(("name", "/peft/folder"),)))."""
        cache_args: dict[str, Any] = {"block_size": block_size}
        if kv_cache_memory is not None:
            cache_args["kv_cache_memory"] = kv_cache_memory
        config = EngineConfig(
            model=ModelConfig(model=model, dtype=dtype, max_model_len=max_model_len,  # type: ignore[arg-type]
                              device=device),
            cache=CacheConfig(num_device_blocks=num_device_blocks, num_cpu_blocks=num_cpu_blocks, **cache_args),
            scheduler=scheduler or SchedulerConfig(),
            attention_backend=attention_backend,
            seed=seed,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            lora=lora or LoraConfig(),
        )
        self.core = EngineCore(config)
        self._tokenizer: Any = None
        self._counter = 0

    def close(self) -> None:
        """Stop the tensor-parallel workers now (they also stop when this process exits)."""
        self.core.close()

    @property
    def model_info(self) -> ModelInfo:
        return self.core.model_info

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.core.model_path)
        return self._tokenizer

    def encode_chat(self, user_message: str) -> list[int]:
        """The model's chat template around one user message, ready for the assistant's answer."""
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        detokenize: bool = True,
        grammar: GrammarSpec | Sequence[GrammarSpec | None] | None = None,
        lora: str | Sequence[str] = "",
    ) -> list[GenerationResult]:
        """Run every prompt to completion in one continuous batch; results in prompt order.
        `grammar`: structured output for every prompt, or one spec (or None) per prompt.
        `lora`: the adapter every prompt runs under, or one name per prompt ("": the base model)."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompt_list = list(prompts)  # type: ignore[arg-type]
        if params is None or isinstance(params, SamplingParams):
            param_list = [params or SamplingParams()] * len(prompt_list)
        else:
            param_list = list(params)
            if len(param_list) != len(prompt_list):
                raise ValueError(f"{len(param_list)} SamplingParams for {len(prompt_list)} prompts")
        grammars = list(grammar) if isinstance(grammar, Sequence) else [grammar] * len(prompt_list)
        if len(grammars) != len(prompt_list):
            raise ValueError(f"{len(grammars)} grammars for {len(prompt_list)} prompts")
        loras = [lora] * len(prompt_list) if isinstance(lora, str) else list(lora)
        if len(loras) != len(prompt_list):
            raise ValueError(f"{len(loras)} adapter names for {len(prompt_list)} prompts")
        results: dict[str, GenerationResult] = {}
        order = []
        for prompt, p, g, name in zip(prompt_list, param_list, grammars, loras, strict=True):
            ids = list(self.tokenizer.encode(prompt)) if isinstance(prompt, str) else list(prompt)
            rid = f"llm-{self._counter}"
            self._counter += 1
            self.core.add_request(Request(rid, ids, p, arrival_time=0.0, grammar=g, lora_name=name))
            results[rid] = GenerationResult(rid, ids, [SampleOutput(i) for i in range(p.n)])
            order.append(rid)
        try:
            self._run(results)
        except BaseException:
            self.core.abort_requests(order)
            raise
        if detokenize:
            for r in results.values():
                for o in r.outputs:
                    o.text = self.tokenizer.decode(o.token_ids, skip_special_tokens=True)
        return [results[rid] for rid in order]

    def beam_search(self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams,
                    *, detokenize: bool = True) -> list[GenerationResult]:
        """Beam search over each prompt (engine/scheduling/beam_group.py): outputs are the beams, best first."""
        return self.generate(prompts, params.sampling(), detokenize=detokenize)

    def _run(self, results: dict[str, GenerationResult]) -> None:
        unfinished = sum(len(r.outputs) for r in results.values())
        while unfinished:
            if not self.core.has_unfinished():
                raise RuntimeError(f"the engine holds no request but {unfinished} samples never finished")
            for d in self.core.step():
                r = results.get(d.request_id)
                if r is None:
                    continue
                out = r.outputs[d.index]
                out.token_ids.extend(d.new_token_ids)
                out.logprobs.extend(d.logprobs)
                if d.prompt_logprobs:
                    r.prompt_logprobs = list(d.prompt_logprobs)
                r.num_cached_tokens = d.num_cached_tokens
                if d.finish_reason is not None:
                    out.finish_reason = d.finish_reason
                    unfinished -= 1
