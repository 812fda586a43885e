"""Serving over HTTP: an asyncio front for the engine (async_engine.py), the OpenAI-compatible
server (openai/), its Prometheus metrics (metrics.py) and chat templates (chat_template.py)."""

from .async_engine import AsyncLLMEngine, EngineStats, RequestStream, StreamDelta

__all__ = ["AsyncLLMEngine", "EngineStats", "RequestStream", "StreamDelta"]
