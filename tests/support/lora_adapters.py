"""Test helpers for LoRA: PEFT-format adapters with random A and B on a base folder, and the merged
reference model (peft's merge_and_unload) saved as a plain folder that our engine and transformers load.
Not imported by the engine itself.
"""

from __future__ import annotations

from pathlib import Path

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def peft_adapter(base: Path, path: Path, *, rank: int, alpha: float, targets: tuple[str, ...] = ALL_TARGETS,
                 seed: int = 0, zero_b: bool = False, rslora: bool = False, std: float = 0.15) -> Path:
    """Save a LoRA adapter of `base` with random A and B (B = 0 when `zero_b`) via peft's own writer."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                        use_rslora=rslora, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.zeros_like(p) if zero_b and "lora_B" in name
                        else torch.randn(p.shape, generator=g) * std)
    peft_model.save_pretrained(path)
    return path


def merged_folder(base: Path, adapter: Path, path: Path) -> Path:
    """The base model with the adapter merged into its weights (peft's merge_and_unload), as an HF folder."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.save_pretrained(path)
    return path
