"""A simulated LLM inference fleet: the model shared by the mock replicas,
the trace replay tool and the offline bounds."""
