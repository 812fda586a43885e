"""The OpenAI-compatible server in a background thread of this process, for tests and notebooks.

Contract: `ServerThread(llm, ...)` builds the app (`entrypoints/openai/api_server.py`,
`build_app`) and serves it with uvicorn on a thread of its own, on a free loopback port unless
given one; `start()` returns once the server accepts connections (or raises), `stop()` lets
in-flight requests finish for `shutdown_timeout` seconds.  `free_port()` is a port nobody
listens on now.  The CLI's `minilm-engine serve` runs the same app in the foreground.
"""

from __future__ import annotations

import socket
import threading

import uvicorn

from minilm_engine.entrypoints import DEFAULT_HOST
from minilm_engine.entrypoints.async_engine import AsyncLLMEngine
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.entrypoints.openai.api_server import CORSOptions, build_app
from minilm_engine.entrypoints.rate_limit import RateLimiter


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """The server in a background thread of this process (tests, notebooks):

        with ServerThread(llm) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")

    `app.state.engine` is reachable as `server.engine` (its stats, its `llm`)."""

    def __init__(self, llm: LLM, host: str = DEFAULT_HOST, port: int | None = None,
                 served_model_names: list[str] | None = None, api_key: str | None = None,
                 shutdown_timeout: float = 2.0, rate_limiter: RateLimiter | None = None,
                 cors: CORSOptions | None = None):
        self.app = build_app(llm, served_model_names, api_key, rate_limiter, cors)
        self.engine: AsyncLLMEngine = self.app.state.engine
        self.host, self.port = host, port or free_port(host)
        config = uvicorn.Config(self.app, host=host, port=self.port, log_level="warning",
                                timeout_graceful_shutdown=shutdown_timeout)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def served_name(self) -> str:
        """The name requests must use (as `ServerProcess.served_name`)."""
        return self.app.state.serving.served_model_names[0]

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread = threading.Thread(target=self._run, name="minilm-server", daemon=True)
        self._thread.start()
        for _ in range(int(timeout / 0.02)):
            if self.server.started:
                return self
            if not self._thread.is_alive():
                break
            self._thread.join(0.02)
        raise RuntimeError(f"the server did not start on {self.url}")

    def _run(self) -> None:
        try:
            self.server.run()
        except SystemExit:  # uvicorn's way of saying startup failed (logged); start() reports it
            pass

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
