"""Tensor parallelism on the CPU (torch.distributed, gloo): N processes each hold a shard of every layer.

    partition.py     which heads, MLP columns and vocabulary rows each rank holds (uneven splits allowed)
    sharding.py      slices the loaded full model into one rank's ParallelLlama
    moe_shard.py     one rank's SparseMoE: every expert's intermediate columns split (not yet wired in)
    layers.py        ParallelLlama: vocabulary-parallel embedding and LM head, all_reduce after the
                     row-parallel o_proj and down_proj (Megatron-LM's placement)
    group.py         the gloo group on loopback, each rank's share of the threads
    step_message.py  the step description rank 0 sends: chunks' tokens, positions, block tables, moves
    leader.py        rank 0 (the engine process): spawns the workers, sends each step, shuts them down
    worker.py        ranks >= 1: `python -m engine.worker.parallel.worker`, the step loop

The scheduler and block manager run once, in rank 0, unchanged; rank 0 alone samples. Size 1
imports nothing from here.
"""
