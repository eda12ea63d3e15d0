"""The serving part: the engine as a process behind a ZeroMQ socket (`pageserve engine`).

    server.py           one ROUTER socket in front of one EngineCore: Hello/Ready, AddRequest, Abort,
                        StepOutputs per gateway per step, Stats, fatal errors told to every gateway
    server_config.py    ServerConfig, and CoreLike: what the server needs of the core
    router_socket.py    the ROUTER socket's options (no drops, heartbeats, size limit, CURVE), bound
    core_factory.py     command-line flags -> frozen EngineConfig -> a loaded EngineCore (imports torch)
    lora_calls.py       admin LoRA loads: read on a worker thread, installed on the loop, told to every gateway
    inflight.py         requests in flight: which gateway asked for each, what to tell it
    step_stats.py       the server's own loop counters, merged with the core's counts into Stats
"""
