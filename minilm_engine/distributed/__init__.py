"""Serving across engines (vLLM's `distributed/`): here, KV transfer for disaggregated prefill."""
