"""Chapter 10's measurements: what a user of a served model sees from outside, over HTTP only.

Contract: the server runs as its own process (`ServerProcess`: `minilm-engine serve` with the
flags a chapter asks for), so the client below shares no interpreter, no GIL and no event loop
with it: what the functions time is what any client on this machine would see.  Each function
talks to it through `bench.serve.send_request` (the load generator's own request code, streaming)
and `/metrics` (the engine's Prometheus counters), and returns a plain pandas table.

    ServerProcess            start `minilm-engine serve ...`, wait for /health, read /metrics, stop
    capacity                 requests/s it completes when they all arrive at once (the queue's onset)
    ttft_by_prompt_length    TTFT of prompts of rising length (fresh text each time, no cache hit)
    stable_prefix_first      the same requests with the shared text first or last: prefix-cache
                             hits and TTFT, interleaved request by request
    tokens_not_requests      the same number of small and of huge requests against a limit in
                             tokens per minute: which get a 429

Timings are medians with [min, max] over repeats, and the lengths (or layouts) are visited in
rotating order, so a burst of noise from other programs hits every configuration alike.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
import pandas as pd

from minilm_engine.bench.datasets import BenchRequest, noodle_requests
from minilm_engine.bench.serve import BenchConfig, run_benchmark, run_sync, send_request
from minilm_engine.course.noodle_corpus import generate_documents
from minilm_engine.course.experiments.server_thread import free_port
from minilm_engine.course.experiments.prefill import corpus_token_ids


@dataclass
class ServerProcess:
    """`minilm-engine serve MODEL --port P ...extra_args` as a child process.

        with ServerProcess("noodle-chef", ["--max-num-seqs", "8"]) as server:
            server.url, server.model, server.prefix_cache_hits()

    `model` None serves the shipped chef.  The server's log (stderr) is kept in `log` once it
    has stopped; a server that exits during start-up raises with the end of that log.
    """

    model: str | None = None
    extra_args: list[str] = field(default_factory=list)
    device: str = "cpu"
    threads: int | None = None  # torch threads of the server (None: serve's default)
    start_timeout_s: float = 120.0
    port: int = 0
    log: str = ""
    _process: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def served_name(self) -> str:
        """The name requests must use: the first --served-model-name, else the model as given."""
        if "--served-model-name" in self.extra_args:
            return self.extra_args[self.extra_args.index("--served-model-name") + 1]
        return self.model or "noodle-chef"

    def start(self) -> ServerProcess:
        self.port = self.port or free_port()
        command = [sys.executable, "-m", "minilm_engine", "serve", self.model or "noodle-chef",
                   "--port", str(self.port), "--device", self.device, "--log-level", "warning",
                   "--shutdown-timeout", "1", *self.extra_args]
        if self.threads is not None:
            command += ["--threads", str(self.threads)]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self.log = self._process.communicate()[1]
                raise RuntimeError(f"`{' '.join(command)}` exited during start-up:\n{self.log[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {self.start_timeout_s:.0f} s:\n{self.log[-3000:]}")

    def metrics(self) -> dict[str, float]:
        """The engine's Prometheus samples, by name without the `minilm:` prefix (summed over labels; counters end in `_total`)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_and_labels, _, value = line.rpartition(" ")
            name = name_and_labels.split("{", 1)[0].split(":", 1)[-1]
            values[name] = values.get(name, 0.0) + float(value)
        return values

    def prefix_cache_hits(self) -> float:
        """Prompt tokens the engine has found in its prefix cache so far (a counter)."""
        return self.metrics()["prefix_cache_hits_total"]

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)  # serve's clean stop: aborts, frees, exits 0
            try:
                _, err = self._process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                _, err = self._process.communicate()
        else:
            _, err = self._process.communicate()
        self.log = err or self.log
        self._process = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _interval(values) -> tuple[float, float, float]:
    a = np.asarray(values, dtype=float)
    return float(np.median(a)), float(a.min()), float(a.max())


def _send_one(config: BenchConfig, request: BenchRequest):
    async def go():
        async with httpx.AsyncClient(timeout=config.timeout_s) as client:
            return await send_request(client, config, request)

    result = run_sync(go())
    if not result.success:
        raise RuntimeError(f"request failed: {result.error}")
    return result


def _text_of_tokens(tokenizer, num_tokens: int, seed: int) -> str:
    """Noodle-shop text of about `num_tokens` tokens (the server counts the exact number)."""
    return tokenizer.decode(corpus_token_ids(tokenizer, num_tokens, seed))


def ttft_by_prompt_length(server: ServerProcess, tokenizer, lengths: list[int], num_repeats: int = 5,
                          seed: int = 0) -> pd.DataFrame:
    """One user, one request at a time: the TTFT of a prompt of each length (2 output tokens).

    Every request's text is new (a different stretch of the corpus for each length and repeat),
    and the function checks on /metrics that the prefix cache found nothing, so each TTFT pays
    its whole prefill.  Lengths are visited in a rotating order.  Returns one row per length:
    prompt tokens (as the server counted them), TTFT median / min / max in ms, and the median
    TTFT per prompt token.
    """
    config = BenchConfig(base_url=server.url, model=server.served_name, ignore_eos=True)
    hits_before = server.prefix_cache_hits()
    times: dict[int, list[float]] = {n: [] for n in lengths}
    counted: dict[int, int] = {}
    for repeat in range(num_repeats):
        shift = repeat % len(lengths)
        for n in lengths[shift:] + lengths[:shift]:
            # A line of its own first: the first block differs from every other prompt's, and a
            # block's hash chains over all before it, so nothing of this prompt can be a hit.
            prompt = f"Order {seed}-{repeat}-{n}:\n" + _text_of_tokens(tokenizer, n, seed=seed + 7919 * repeat + n)
            result = _send_one(config, BenchRequest(prompt=prompt, max_tokens=2))
            times[n].append(result.ttft)
            counted[n] = result.num_prompt_tokens
    hits = server.prefix_cache_hits() - hits_before
    rows = []
    for n in lengths:
        median, low, high = _interval(times[n])
        rows.append({"prompt tokens": counted[n], "TTFT p50 ms": 1000 * median, "TTFT min ms": 1000 * low,
                     "TTFT max ms": 1000 * high, "ms per prompt token": 1000 * median / counted[n]})
    table = pd.DataFrame(rows)
    table.attrs["prefix_cache_hit_tokens"] = hits  # 0 when every prompt paid its whole prefill
    table.attrs["ttft_seconds"] = {counted[n]: times[n] for n in lengths}
    return table


def _stable_text(tokenizer, num_tokens: int, seed: int) -> str:
    """A "system prompt": the shop's instructions and menu, the same for every request of a run."""
    return "You are the noodle shop's assistant. Today's orders follow.\n" + _text_of_tokens(tokenizer, num_tokens, seed)


def stable_prefix_first(server: ServerProcess, tokenizer, stable_tokens: int = 256, question_tokens: int = 16,
                        num_requests: int = 8, seed: int = 0) -> pd.DataFrame:
    """The same requests (a long shared text + a short per-request question) in two layouts:

        "stable first"    shared text, then the question   -> every request after the first
                                                              finds the shared blocks cached
        "question first"  the question, then shared text   -> the prompts differ from token 1

    Requests alternate between the layouts one by one (each layout has its own shared text, so
    one cannot warm the other) and the prefix-cache hits of each are read from /metrics after
    each request.  The first request of each layout (cold for both) is reported apart.  Returns
    one row per layout: prompt tokens, share of prompt tokens found in the cache, TTFT of the
    first request, and TTFT median / min / max over the others, in ms.
    """
    if num_requests < 2:
        raise ValueError(f"num_requests must be >= 2 (the first request of a layout is always cold), got {num_requests}")
    config = BenchConfig(base_url=server.url, model=server.served_name, ignore_eos=True)
    questions = [f"\nGuest {i}: " + generate_documents(1, seed + 100 + i)[0][: question_tokens * 4]
                 for i in range(num_requests)]
    shared = {"stable first": _stable_text(tokenizer, stable_tokens, seed + 1),
              "question first": _stable_text(tokenizer, stable_tokens, seed + 2)}
    layouts = {"stable first": lambda i: shared["stable first"] + questions[i],
               "question first": lambda i: questions[i] + "\n" + shared["question first"]}
    stats = {name: {"ttft": [], "hits": 0.0, "prompt": 0} for name in layouts}
    for i in range(num_requests):
        order = list(layouts) if i % 2 == 0 else list(layouts)[::-1]
        for name in order:
            before = server.prefix_cache_hits()
            result = _send_one(config, BenchRequest(prompt=layouts[name](i), max_tokens=2))
            stats[name]["hits"] += server.prefix_cache_hits() - before
            stats[name]["prompt"] += result.num_prompt_tokens
            stats[name]["ttft"].append(result.ttft)
    rows = []
    for name, s in stats.items():
        median, low, high = _interval(s["ttft"][1:])
        rows.append({"layout": name, "prompt tokens": s["prompt"] / num_requests,
                     "cached share": s["hits"] / s["prompt"], "first TTFT ms": 1000 * s["ttft"][0],
                     "TTFT p50 ms": 1000 * median, "TTFT min ms": 1000 * low, "TTFT max ms": 1000 * high})
    table = pd.DataFrame(rows)
    table.attrs["ttft_seconds"] = {name: s["ttft"][1:] for name, s in stats.items()}
    return table


def capacity(server, num_requests: int = 32, output_len: int = 32, seed: int = 0) -> float:
    """Requests per second the server completes when `num_requests` noodle-shop requests
    (`output_len` tokens each) are all sent at once: the rate past which a queue builds.
    Chapters set their background traffic as fractions of it, so "busy" means the same on a
    laptop and on a slower CI machine."""
    config = BenchConfig(base_url=server.url, model=server.served_name, ignore_eos=True, seed=seed)
    result = run_benchmark(config, noodle_requests(num_requests, output_len=output_len, seed=seed), progress=False)
    failed = [r.error for r in result.results if not r.success]
    if failed:
        raise RuntimeError(f"{len(failed)} of {num_requests} requests failed, e.g. {failed[0]}")
    return result.metrics.request_throughput


def tokens_not_requests(model: str | None = None, tokenizer=None, *, device: str = "cpu", threads: int | None = 1,
                        num_requests: int = 8, small: tuple[int, int] = (16, 8), huge: tuple[int, int] = (300, 100),
                        seed: int = 0) -> pd.DataFrame:
    """Two users send the same number of requests against a server that limits every key in
    tokens per minute: one sends small requests (`small` = prompt tokens, max_tokens), the other
    huge ones.  The limit is set to 2.5 huge requests' worth of tokens (prompt + max_tokens, what
    the server reserves at admission), which the small user's whole series stays under.  One
    request at a time, each user on its own key; returns a row per user: requests sent, tokens
    each reserves, how many were answered 200 and 429, and the `x-ratelimit-remaining-tokens`
    of the last answer.  `table.attrs["limit_tpm"]` is the limit.
    """
    if tokenizer is None:
        raise ValueError("tokens_not_requests needs the model's tokenizer (to build prompts of known length)")
    prompts = {name: tokenizer.decode(corpus_token_ids(tokenizer, n, seed + i))
               for i, (name, (n, _)) in enumerate((("small", small), ("huge", huge)))}
    lengths = {name: len(tokenizer.encode(p, add_special_tokens=False)) for name, p in prompts.items()}
    max_tokens = {"small": small[1], "huge": huge[1]}
    huge_cost = lengths["huge"] + huge[1] + 2  # + a BOS the server may add
    limit = int(2.5 * huge_cost)
    if num_requests * (lengths["small"] + small[1] + 2) > limit:
        raise ValueError("the small requests must fit the limit: use fewer or smaller ones")
    rows = []
    with ServerProcess(model, ["--rate-limit-tpm", str(limit)], device=device, threads=threads) as server:
        for name in ("small", "huge"):
            codes, remaining, reserved = [], None, None
            for _ in range(num_requests):
                reply = httpx.post(server.url + "/v1/completions", timeout=120,
                                   headers={"Authorization": f"Bearer user-{name}"},
                                   json={"model": server.served_name, "prompt": prompts[name],
                                         "max_tokens": max_tokens[name], "temperature": 0, "ignore_eos": True})
                codes.append(reply.status_code)
                remaining = reply.headers.get("x-ratelimit-remaining-tokens", remaining)
                if reply.status_code == 200:
                    reserved = reply.json()["usage"]["prompt_tokens"] + max_tokens[name]
            rows.append({"user": f"{name} requests", "requests": num_requests,
                         "tokens reserved each": reserved if reserved is not None else lengths[name] + max_tokens[name],
                         "answered 200": codes.count(200), "answered 429": codes.count(429),
                         "other answers": len(codes) - codes.count(200) - codes.count(429),
                         "remaining tokens after": int(remaining) if remaining is not None else None})
    table = pd.DataFrame(rows)
    table.attrs["limit_tpm"] = limit
    return table
