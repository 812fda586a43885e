"""The engine's core: what a step decides, in plain data.

    request.py, sampling_params.py   a request's state and what the caller asked for
    request_queue.py, scheduler.py   who runs this step and how many tokens each (`schedule()`),
                                     then the step's tokens applied (`update_from_output()`)
    kv_cache_manager.py              block tables, slots and prefix-cache hits per request
    block_pool.py                    ref-counted KV blocks, the LRU free queue, block hashes
    kv_cache_utils.py                the block arithmetic (cdiv, slot mapping), written once
    kv_cache_sizing.py               how many blocks the pool gets, and what they hold
    outputs.py                       what a step and a request return
    config.py                        `EngineConfig`; speculative_config.py, spec_decode_stats.py
    trace.py                         a record of every step, for views and plots

Nothing here runs the model: `worker/` does, on the schedule this folder produces.
"""
