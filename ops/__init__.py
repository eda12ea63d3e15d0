"""Operations: the `pageserve` command and everything around the two processes.

    cli.py          `pageserve <subcommand>`: dispatches to the modules below (and to engine/gateway servers)
    launcher.py     `pageserve up`: a private redis-server, the engine and the gateway, a first key
    children.py     the processes `up` starts: each in its own session, stopped in order with a grace
    engine_group.py `up`'s engine replicas: logs, restarts after a death, the crash-loop stop
    supervisor.py   the restart policy (pure): the systemd units' back-off, the crash-loop rule
    admin.py        `pageserve admin`: tenants, keys, quotas, usage, audit (through gateway.tenancy)
    generate.py     `pageserve generate "prompt"`: offline generation through engine.LLM
    kernels_aot.py  compiles every Triton kernel for sm_90 without a GPU (python -m ops.kernels_aot)
    bench/          `pageserve bench ...`: offline, priority, admission, streaming; bench/kernels/ times the kernels
    systemd/        unit files for the engine and the gateway
    bootstrap.sh    the README's two commands: set up, then serve or test

ops/ may import every other package; nothing imports ops/ (tests/test_architecture.py).
"""
