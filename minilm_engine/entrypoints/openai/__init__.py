"""The OpenAI-compatible API: wire format (protocol.py), request handling (serving.py), the
routes (api_server.py)."""

from minilm_engine.entrypoints.openai.api_server import build_app, serve

__all__ = ["build_app", "serve"]
