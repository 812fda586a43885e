"""The continuous-batching engine over a paged KV cache, shaped like vLLM's `LLMEngine`.

Contract: `add_request` validates and queues (raising before any state changes); each `step()`
runs one scheduler decision and one forward and returns the `RequestOutput`s of the requests
that advanced; `abort_request` frees a request's blocks at once.  Steps are recorded in `trace`.

    step():  propose ──> Scheduler.schedule(drafts) ──> ModelRunner.execute() ──> sampled tokens
             (drafts,      (BlockManager: slots,          (PagedAttention over         │
              if any)       prefix hits, preempt)          the PagedKVCache)           ▼
             Scheduler.update_from_output: append ids, stop on EOS / stop ids, roll rejected
             drafts back ──> OutputProcessor.process: text, stop strings ──> release blocks

With a `speculative_config`, the proposer (`worker/spec_decode/`) drafts up to K tokens per
decoding request, the scheduler carries each draft in its `ScheduledRequest`, and one forward
verifies them (`worker/spec_decode/rejection_sampler.py`).
"""

from __future__ import annotations

import time

from minilm_engine.model.attention.backends import get_attention_backend
from minilm_engine.entrypoints.input_processor import InputProcessor, PromptType
from minilm_engine.entrypoints.output_processor import OutputProcessor
from minilm_engine.core.kv_cache_manager import BlockManager
from minilm_engine.core.block_pool import BlockPool
from minilm_engine.worker.block_table import BlockTable
from minilm_engine.core.kv_cache_utils import cdiv
from minilm_engine.model.attention.kv_cache import PagedKVCache
from minilm_engine.core.kv_cache_sizing import KVCacheBudget, decide_num_kv_blocks
from minilm_engine.model import CausalLM
from minilm_engine.core.outputs import RequestOutput
from minilm_engine.core.request import Request, RequestStatus
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.spec_decode_stats import SpecDecodingStats
from minilm_engine.worker.spec_decode.ngram_proposer import NgramProposer
from minilm_engine.worker.spec_decode.proposer import DraftModelProposer, load_draft_model, num_drafts_wanted
from minilm_engine.core.outputs import DraftTokens
from minilm_engine.core.config import EngineConfig
from minilm_engine.worker.cuda_graphs import DecodeGraphRunner
from minilm_engine.worker.model_runner import ModelRunner
from minilm_engine.core.scheduler import Scheduler, SchedulerOutput, is_decoding
from minilm_engine.core.trace import ScheduledChunk, StepCallback, StepRecord, StepTrace

# The rejection sampler draws from temperature / min-p / top-k / top-p only, keeps no logprobs,
# and a grammar would need rolling back with rejected drafts.
_NOT_WITH_SPECULATION = ("logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty",
                         "repetition_penalty", "logit_bias", "min_tokens",
                         "structured_outputs")


def check_speculation_supports(params: SamplingParams) -> None:
    """Raise for sampling options speculative decoding does not implement."""
    defaults = SamplingParams()
    for name in _NOT_WITH_SPECULATION:
        if getattr(params, name) not in (getattr(defaults, name), {}):
            raise ValueError(
                f"{name} is not supported with speculative decoding (speculative_config); "
                "serve without it to use this option"
            )


def check_priority(priority: int, scheduling_policy: str) -> None:
    """vLLM's rule: a priority other than 0 needs the priority policy."""
    if priority != 0 and scheduling_policy != "priority":
        raise ValueError(
            f"got priority {priority}, but priority scheduling is not enabled "
            f"(scheduling_policy={scheduling_policy!r}); start the engine with "
            "scheduling_policy='priority' (--scheduling-policy priority)"
        )


class LLMEngine:
    def __init__(
        self,
        model: CausalLM,
        tokenizer,
        input_processor: InputProcessor,
        config: EngineConfig | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.input_processor = input_processor
        self.output_processor = OutputProcessor(tokenizer)
        self.config = config or EngineConfig()
        self.max_model_len = input_processor.max_model_len
        if not self.config.enable_chunked_prefill and self.config.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill, max_num_batched_tokens ({self.config.max_num_batched_tokens}) "
                f"must be >= max_model_len ({self.max_model_len}) so that every prompt fits one step"
            )
        spec = self.config.speculative_config
        draft = None
        if spec is not None and spec.method == "draft_model":
            draft = load_draft_model(spec, model, tokenizer, self.max_model_len)
        num_blocks = decide_num_kv_blocks(
            self.config, model.config, model.dtype, model.device, self.max_model_len,
            draft_model_config=None if draft is None else draft.config,
        )
        self.kv_budget = KVCacheBudget.of(model.config, model.dtype, self.config.block_size, num_blocks,
                                          None if draft is None else draft.config)
        self._derive_max_model_len()
        self.trace = StepTrace()
        self.block_pool = BlockPool(
            num_blocks,
            enable_caching=self.config.enable_prefix_caching,
            observer=self.trace.block_log if self.config.record_trace else None,
        )
        self.block_manager = BlockManager(self.block_pool, self.config.block_size,
                                          self.config.enable_prefix_caching)
        self.cache = PagedKVCache(model.config, num_blocks, self.config.block_size, model.dtype, model.device)
        self.scheduler = Scheduler(self.config, self.block_manager)
        # "auto" becomes "triton" on a CUDA GPU with Triton, "torch" otherwise.
        self.attention_backend = get_attention_backend(self.config.attention_backend, model.device,
                                                       model.dtype)
        block_table = BlockTable(
            self.config.max_num_seqs, cdiv(self.max_model_len, self.config.block_size), self.config.block_size
        )
        self.runner = ModelRunner(model, self.cache, block_table, self.attention_backend,
                                  self._capture_decode_graphs())
        self.proposer: DraftModelProposer | NgramProposer | None = None
        self.spec_decoding_stats: SpecDecodingStats | None = None  # the engine's totals
        if draft is not None:
            self.proposer = DraftModelProposer(
                draft, num_blocks, self.config.block_size, self.config.enable_prefix_caching,
                self.attention_backend, tokenizer,
            )
        elif spec is not None:  # method "ngram": drafts copied from the request's own tokens
            self.proposer = NgramProposer(model.config.vocab_size, spec.prompt_lookup_min, spec.prompt_lookup_max)
        if spec is not None:
            self.spec_decoding_stats = SpecDecodingStats(spec.num_speculative_tokens)
        self.requests: dict[str, Request] = {}
        self.num_steps = 0

    def _derive_max_model_len(self) -> None:
        """A `max_model_len` the caller did not set is cut to what one request alone can hold in
        the pool (as vLLM derives it); one the caller set is kept, and requests above the pool
        are refused one by one."""
        processor = self.input_processor
        if processor.max_model_len_reason is not None:  # the caller's, or already derived
            return
        fits = self.kv_budget.max_context_len(1)
        if fits < self.max_model_len:
            self.max_model_len = processor.max_model_len = fits
            processor.max_model_len_reason = (
                f"derived from the KV cache: {self.kv_budget.num_blocks} blocks x {self.config.block_size} "
                f"tokens = {fits} tokens for one request alone")

    @property
    def decode_graphs(self) -> DecodeGraphRunner | None:
        """The runner's CUDA graphs for decode steps (None: every step runs eagerly)."""
        return self.runner.decode_graphs

    def _capture_decode_graphs(self) -> DecodeGraphRunner | None:
        """CUDA graphs for decode steps: on a CUDA GPU with the Triton backend, unless
        `enforce_eager` (the torch reference plans each step on the host: a graph cannot)."""
        if self.config.enforce_eager or self.model.device.type != "cuda" or self.attention_backend.name != "triton":
            return None
        max_blocks_per_seq = cdiv(self.max_model_len, self.config.block_size)
        graphs = DecodeGraphRunner(self.model, self.cache, self.attention_backend,
                                   self.config.max_num_seqs, max_blocks_per_seq)
        graphs.capture()
        return graphs

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: PromptType,
                    sampling_params: SamplingParams | None = None, priority: int = 0) -> Request:
        """Validate, tokenize and queue a request; raises ValueError/TypeError if it is bad.
        `priority`: lower is served first, under scheduling_policy="priority" only."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {request_id!r}")
        params = sampling_params or SamplingParams()
        request = self.input_processor.make_request(request_id, prompt, params, priority)
        self.add_prepared_request(request)
        return request

    def add_prepared_request(self, request: Request) -> None:
        self._check_new_request(request)
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)

    def _check_new_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        check_priority(request.priority, self.config.scheduling_policy)
        if self.proposer is not None:
            check_speculation_supports(request.sampling_params)
        # A request that could not fit the whole pool even alone would be preempted forever.
        worst_case = request.num_prompt_tokens + request.max_new_tokens
        blocks_needed = cdiv(worst_case, self.config.block_size)
        if blocks_needed > self.block_pool.num_blocks:
            raise ValueError(
                f"request {request.request_id!r} may need {worst_case} tokens of KV cache "
                f"({blocks_needed} blocks of {self.config.block_size}), but the whole pool has "
                f"{self.block_pool.num_blocks} blocks; lower max_tokens or grow num_kv_blocks"
            )

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; unknown or finished ids are ignored."""
        request = self.requests.pop(request_id, None)
        if request is None or request.finished:
            return
        self._release(request)
        self.output_processor.free(request_id)
        request.abort()

    # -- KV transfer hooks (distributed/kv_transfer/: disaggregated prefill) ---------------

    def detach_request(self, request_id: str) -> Request:
        """Take a running request out of the batch; its blocks stay allocated until the caller
        has copied the KV out and calls `block_manager.free(request_id)`."""
        request = self.requests.get(request_id)
        if request is None or request.status is not RequestStatus.RUNNING:
            raise ValueError(f"request {request_id!r} is not running in this engine")
        self.scheduler.detach(request)
        if self.proposer is not None:
            self.proposer.free(request_id)
        del self.requests[request_id]
        return request

    def can_add_computed_request(self) -> bool:
        """A batch slot is free, and no preempted request waits (a sign of short memory)."""
        return len(self.scheduler.running) < self.config.max_num_seqs and not self.scheduler.waiting

    def add_computed_request(self, request: Request) -> None:
        """Admit a request whose KV the caller wrote into a block table it allocated here
        (every token but the last computed): its next step is a decode.  Raises ValueError
        (KeyError: no block table) and changes nothing otherwise."""
        self._check_new_request(request)
        if request.finished or not is_decoding(request):
            raise ValueError(
                f"request {request.request_id!r} must be unfinished with every token but its last "
                f"computed ({request.num_computed_tokens} of {request.num_tokens} are)"
            )
        table = self.block_manager.get_block_table(request.request_id)  # KeyError if none
        if len(table) * self.config.block_size < request.num_computed_tokens:
            raise ValueError(
                f"request {request.request_id!r}: its {len(table)} blocks cannot hold its "
                f"{request.num_computed_tokens} computed tokens"
            )
        if not self.can_add_computed_request():
            raise ValueError("no batch slot: check can_add_computed_request() first")
        self.requests[request.request_id] = request
        self.scheduler.add_running(request)

    def _release(self, request: Request) -> None:
        """Free a finished or aborted request's blocks, the draft's too."""
        self.scheduler.finish(request)
        if self.proposer is not None:
            self.proposer.free(request.request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    def add_step_callback(self, callback: StepCallback) -> None:
        """Call `callback(record)` after every step (widgets follow the engine this way)."""
        self.trace.callbacks.append(callback)

    def remove_step_callback(self, callback: StepCallback) -> None:
        self.trace.callbacks.remove(callback)

    # -- one step ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One scheduler decision and one forward pass; the outputs of the requests that got a token."""
        return [request.to_output() for request in self.step_requests()]

    def step_requests(self) -> list[Request]:
        """`step`, returning the `Request`s that got a token rather than snapshots of them
        (a snapshot copies the output ids: at 256 requests, a millisecond a step)."""
        start = time.perf_counter()
        drafts = self._propose_drafts()  # 1. propose
        sched = self.scheduler.schedule(drafts)  # 2. schedule
        for request in sched.preempted:
            if self.proposer is not None:
                self.proposer.free(request.request_id)  # recomputed from scratch when resumed
        if sched.is_empty:
            if self.scheduler.has_unfinished_requests():
                raise RuntimeError("scheduler made no progress (pool too small for any request)")
            return []
        now = time.perf_counter()
        for s in sched.scheduled:
            if s.request.metrics.first_scheduled_time is None:
                s.request.metrics.first_scheduled_time = now
        output = self.runner.execute(sched)  # 3. execute
        results = output.sampled_token_ids
        update = self.scheduler.update_from_output(sched, results, output)  # 4. update
        for s, tokens in zip(sched.scheduled, results):
            if s.draft is not None:
                self._observe_round(s.request, len(s.draft), len(tokens) - 1)
        for match in self.output_processor.process(update.advanced):  # text, stop strings
            match.request.stop_on_string(match.stop, match.num_output_tokens)

        finished = []  # 5. release, in step order (stop strings included)
        for request in (r for r in update.advanced if r.finished):
            self._release(request)
            self.requests.pop(request.request_id, None)
            finished.append(request.request_id)
        for request_id in drafts:
            # The draft computed its own guesses: back to what the target kept.
            request = self.requests.get(request_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                self.proposer.rollback(request)
        advanced = update.advanced
        self.num_steps += 1
        if self.config.record_trace:
            self._record(start, sched, results, finished)
        return advanced

    # -- speculative decoding ---------------------------------------------------------------

    def _propose_drafts(self) -> dict[str, DraftTokens]:
        """The draft's guesses (ids and probabilities) per decoding request id."""
        if self.proposer is None:
            return {}
        k = self.config.speculative_config.num_speculative_tokens
        decoding = [r for r in self.scheduler.running if is_decoding(r)]
        proposals = self.proposer.propose(decoding, [num_drafts_wanted(r, k) for r in decoding])
        return {request.request_id: proposal for request, proposal in zip(decoding, proposals)}

    def _observe_round(self, request: Request, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        metrics = request.metrics
        if metrics.spec_decoding is None:
            metrics.spec_decoding = SpecDecodingStats(self.spec_decoding_stats.num_spec_tokens)
        metrics.spec_decoding.observe(num_draft_tokens, num_accepted_tokens)
        self.spec_decoding_stats.observe(num_draft_tokens, num_accepted_tokens)

    def _record(self, start: float, sched: SchedulerOutput, results: list[list[int]], finished: list[str]) -> None:
        pool = self.block_pool
        chunks = [
            ScheduledChunk(
                s.request.request_id,
                s.num_new_tokens if s.is_prefill else 0,
                0 if s.is_prefill else s.num_new_tokens,
                s.num_cached_tokens,
                num_draft_tokens=len(s.spec_token_ids),
                num_accepted_tokens=len(tokens) - 1 if s.spec_token_ids else 0,
                draft_token_ids=list(s.spec_token_ids),
                output_token_ids=tokens,
            )
            for s, tokens in zip(sched.scheduled, results)
        ]
        self.trace.append(
            StepRecord(
                step=self.num_steps - 1,
                start_time=start,
                duration_s=time.perf_counter() - start,
                chunks=chunks,
                preempted=[r.request_id for r in sched.preempted],
                finished=finished,
                block_events=self.trace.block_log.drain(),
                num_waiting=len(self.scheduler.waiting),
                num_running=len(self.scheduler.running),
                num_blocks=pool.num_blocks,
                num_used_blocks=pool.num_used_blocks,
                num_cached_blocks=pool.num_cached_free_blocks,
                block_tables={
                    r.request_id: self.block_manager.get_block_table(r.request_id)
                    for r in self.scheduler.running
                },
                tokens_in_cache={r.request_id: r.num_computed_tokens for r in self.scheduler.running},
            )
        )
