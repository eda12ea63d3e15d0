"""Building blocks of the decoder models: norm, rotary embedding, paged attention, MLP,
mixture of experts (moe.py)."""
