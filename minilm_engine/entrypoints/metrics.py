"""Prometheus metrics of the server, named like vLLM's with a `minilm:` prefix.

Contract: `ServerMetrics(async_engine, model_name)` owns its own `CollectorRegistry` (several
servers can live in one process).  Engine state is read from the engine thread's stats snapshot
at scrape time; per-request latencies and token counts are recorded by `observe_finished` when
a request ends.  `render()` is the text format for GET /metrics.

    minilm:num_requests_running / _waiting, kv_cache_usage_perc, num_kv_blocks_used / _total
    minilm:num_preemptions_total, prefix_cache_queries_total / _hits_total (tokens)
    minilm:prompt_tokens_total, generation_tokens_total, request_success_total{finished_reason}
    minilm:num_requests_rate_limited_total{limit}, num_aborted_requests_total
    minilm:time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from minilm_engine.core.request import Request
from minilm_engine.entrypoints.async_engine import AsyncLLMEngine

PREFIX = "minilm:"
disable_created_metrics()  # no "*_created" timestamp series (vLLM turns them off too)
# Seconds; from a GPU's milliseconds to a busy CPU's tens of seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


class _EngineCollector:
    """Reads the engine's state at scrape time, so the numbers are never stale."""

    def __init__(self, engine: AsyncLLMEngine, model_name: str):
        self.engine = engine
        self.labels = {"model_name": model_name}

    def collect(self):
        stats = self.engine.stats
        names = list(self.labels)
        values = list(self.labels.values())
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        metrics = [
            (gauge, "num_requests_running", "Requests in the running batch.", stats.num_running),
            (gauge, "num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting),
            (gauge, "kv_cache_usage_perc", "KV-cache usage: 1 means all blocks are in use.", stats.kv_cache_usage),
            (gauge, "num_kv_blocks_used", "KV blocks held by requests.", stats.num_used_blocks),
            (gauge, "num_kv_blocks_total", "KV blocks in the pool.", stats.num_blocks),
            (counter, "num_preemptions", "Requests preempted (their KV freed, recomputed later).",
             stats.num_preemptions),
            (counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             stats.num_prefix_cache_queries),
            (counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.num_prefix_cache_hits),
            (counter, "num_aborted_requests", "Requests aborted (client disconnects, shutdown).", stats.num_aborted),
        ]
        for kind, name, doc, value in metrics:
            family = kind(PREFIX + name, doc, labels=names)
            family.add_metric(values, value)
            yield family


class ServerMetrics:
    def __init__(self, engine: AsyncLLMEngine, model_name: str):
        """Registers itself as `engine.on_request_end`."""
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=self.registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry).labels(model_name)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between two output tokens.", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to last token.", E2E_BUCKETS)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.request_success = Counter(
            PREFIX + "request_success", "Requests finished, by reason.", labels + ["finished_reason"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            PREFIX + "num_requests_rate_limited", "Requests answered 429 (over a rate limit), by the limit "
            "that bound.", labels + ["limit"], registry=self.registry,
        )
        self.model_name = model_name
        engine.on_request_end = self.observe_finished

    def observe_rate_limited(self, kind: str) -> None:
        """One request refused by the rate limiter (`kind`: "tokens" or "requests")."""
        self.rate_limited.labels(self.model_name, kind).inc()

    def observe_finished(self, request: Request) -> None:
        """Record one ended request (finished or aborted): its latencies and token counts.
        Called on the engine thread (`AsyncLLMEngine.on_request_end`); prometheus_client is
        thread-safe."""
        metrics, finish_reason = request.metrics, request.finish_reason
        if metrics.ttft is not None:
            self.ttft.observe(metrics.ttft)
        for gap in metrics.inter_token_latencies:
            self.itl.observe(gap)
        if metrics.e2e_latency is not None and finish_reason != "abort":
            self.e2e.observe(metrics.e2e_latency)
        self.prompt_tokens.inc(request.num_prompt_tokens)
        self.generation_tokens.inc(len(request.output_token_ids))
        self.request_success.labels(self.model_name, finish_reason or "abort").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
