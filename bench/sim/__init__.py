"""The simulated LLM inference fleet (python3 -m unittest discover -s t/sim
-t . tests it):

    model.py         a replica's tokens, block chains and prefix cache
    fleet.py         replicas and their states: slots, prefill lane, load
    trace.py         records of a Mooncake-style trace as chat requests
    workloads.py     the trace and generated workloads as one request list
    profiles.py      fleet profiles: replicas, slots, caches, rate
    http1.py         HTTP/1.1 on asyncio streams, for servers and clients
    mock_backend.py  the replicas served over HTTP, in real time
    replay.py        a trace replayed open loop against an endpoint
    bounds.py        the same fleet simulated offline: bounds and policies
"""
