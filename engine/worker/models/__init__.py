"""The model: one decoder, its options, and how each architecture's config.json reads into them.

    spec.py           ModelSpec (numbers + named options, frozen) and WeightNames (checkpoint names)
    decoder.py        DecoderModel: embed -> layers (attention, gated MLP or experts) -> logits
    architectures/    one config reader and weight-name map per family (llama, qwen, gemma, phi3, moe)
"""
