"""The engine's core: what a step decides, in plain data (requests, the scheduler and its queue,
the KV cache manager and block pool, the scheduler's output types; ARCHITECTURE.md lists the
files).  Nothing here runs the model: `worker/` does, on the schedule this folder produces.
"""
