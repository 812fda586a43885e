"""The front doors: `LLM`, the engine's step loop, the asyncio front (async_engine.py), the
OpenAI-compatible server (openai/), its metrics and the CLI (cli/)."""

from minilm_engine.entrypoints.async_engine import AsyncLLMEngine, EngineStats, RequestStream, StreamDelta

DEFAULT_HOST = "127.0.0.1"  # loopback: reachable from this machine only, unless asked otherwise

__all__ = ["DEFAULT_HOST", "AsyncLLMEngine", "EngineStats", "RequestStream", "StreamDelta"]
