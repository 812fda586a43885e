"""Serving over HTTP: an asyncio front for the engine (async_engine.py), the OpenAI-compatible
server (openai/), its Prometheus metrics (metrics.py) and chat templates (entrypoints/chat_template.py)."""

from minilm_engine.entrypoints.async_engine import AsyncLLMEngine, EngineStats, RequestStream, StreamDelta

DEFAULT_HOST = "127.0.0.1"  # loopback: reachable from this machine only, unless asked otherwise

__all__ = ["DEFAULT_HOST", "AsyncLLMEngine", "EngineStats", "RequestStream", "StreamDelta"]
