"""One engine step on the model: flatten the scheduled tokens, run, sample.

Contract: `ModelRunner.execute(scheduler_output)` applies the step's block-table changes to its
`BlockTable` (it never asks the block manager), computes keys/values for every scheduled token
into the paged cache and returns a `ModelRunnerOutput`: per request, the tokens to append (one
sampled token; none for a prompt chunk that does not finish the prompt; the accepted drafts and
one more for a request verifying drafts), their logprobs, and this chunk's prompt logprobs
where asked.  All sampled rows go through the LM head in one matmul.

    scheduled:    A: 4 prompt tokens   B: 1 decode token   C: 2 of 5 prompt tokens (a chunk)
    input_ids:    [ a0 a1 a2 a3 | b7 | c0 c1 ]          flat, no padding
    positions:    [  0  1  2  3 |  7 |  0  1 ]
    logits taken at:         ^a3   ^b7          (C samples nothing until its prompt is done)

    with D verifying 2 drafts:   [ ... | d9 x1 x2 | ... ]    logits at d9, x1 and x2
                                                             (`spec_decode/rejection_sampler.py`)

The inputs go up through persistent buffers (`InputBuffer`); what the host needs of the step it
reads from the host copies it built, never back from the device.  It reads back only what the
step returns: the sampled tokens, the logprobs asked for, the verification's outcome.
"""

from __future__ import annotations

import numpy as np
import torch

from minilm_engine.model.attention.backends import AttentionBackend
from minilm_engine.model.attention.context import PagedAttention
from minilm_engine.model.attention.paged import PagedAttentionMetadata
from minilm_engine.worker.block_table import BlockTable
from minilm_engine.worker.input_batch import Chunk, InputBuffer, flatten_chunks
from minilm_engine.model.attention.kv_cache import PagedKVCache
from minilm_engine.model import CausalLM
from minilm_engine.model.device import device_context, upload
from minilm_engine.worker.sampler import gather_logprobs, sample_requests
from minilm_engine.worker.spec_decode.rejection_sampler import rejection_sample_batch
from minilm_engine.worker.cuda_graphs import DecodeGraphRunner
from minilm_engine.core.scheduler import SchedulerOutput
from minilm_engine.core.outputs import PromptLogprobs, ModelRunnerOutput


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        cache: PagedKVCache,
        block_table: BlockTable,  # the runner's own: rows follow the scheduler's output
        attention_backend: AttentionBackend | None = None,  # None: the torch reference
        decode_graphs: DecodeGraphRunner | None = None,  # None: every step runs eagerly
    ):
        self.model = model
        self.cache = cache
        self.block_table = block_table
        self.attention_backend = attention_backend
        self.decode_graphs = decode_graphs
        # The step's inputs; then the rows the LM head reads and the rejection sampler's indices.
        self.input_buffer = InputBuffer(model.device)
        self.sample_buffer = InputBuffer(model.device, size=4 * block_table.block_ids.shape[0])

    def prepare(self, sched: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, PagedAttentionMetadata]:
        """Apply the step's block-table changes, then build (input_ids (N,), positions (N,),
        metadata) for the flattened step."""
        table = self.block_table
        for request_id in sched.freed_request_ids:
            table.remove(request_id)
        chunks = []
        for s in sched.scheduled:
            rid = s.request.request_id
            table.update(rid, s.num_kept_blocks, s.new_block_ids)
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            # A speculating decode computes its last token, then its drafts after it.
            token_ids = s.request.all_token_ids[start : end - len(s.spec_token_ids)] + s.spec_token_ids
            chunks.append(Chunk(rid, token_ids, start))
        return flatten_chunks(chunks, table.block_size, self.model.device, table, self.input_buffer)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        # Triton launches and graph replays go to the *current* CUDA device: make it the model's.
        with device_context(self.model.device):
            return self._execute(sched)

    def _execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        input_ids, positions, meta = self.prepare(sched)
        scheduled = sched.scheduled
        graphs = self.decode_graphs
        if graphs is not None and graphs.can_run(len(input_ids), meta):
            hidden = graphs.run(input_ids, positions, meta)  # (N, hidden), N == num_seqs
        else:
            attn = PagedAttention(self.cache, meta, self.attention_backend)
            hidden = self.model(input_ids, positions, attn)  # (N, hidden)
        results: list[list[int]] = [[] for _ in scheduled]
        out = ModelRunnerOutput(results, [None] * len(scheduled), self._prompt_logprobs(scheduled, hidden, meta))
        # Requests whose every known token is now computed get tokens: a plain one from its
        # last row, a verifying one from the rows of its last token and its k drafts.
        plain = [i for i, s in enumerate(scheduled) if s.samples_token and s.draft is None]
        verifying = [i for i, s in enumerate(scheduled) if s.draft is not None]
        if not plain and not verifying:
            return out
        # Which rows: from the host's copy of the offsets (no read-back), sent over in one copy.
        ends = meta.on_host().query_start_loc[1:]  # (S,) one past each request's last row
        rows = [ends[plain] - 1]  # (num_plain,) each plain request's last row
        rows += [np.arange(ends[i] - 1 - len(scheduled[i].draft), ends[i]) for i in verifying]  # (k + 1,) each
        (rows,) = self.sample_buffer.upload([np.concatenate(rows)])
        logits = self.model.compute_logits(hidden.index_select(0, rows))  # (num_plain + sum of k + 1, V)
        if plain:
            sampled = sample_requests(logits[: len(plain)], [scheduled[i].request for i in plain])
            for i, token, logprobs in zip(plain, sampled.token_ids.tolist(), sampled.logprobs):
                results[i] = [token]
                out.logprobs[i] = logprobs
        if verifying:  # speculative decoding: every verifying request at once
            requests = [scheduled[i].request for i in verifying]
            accepted = rejection_sample_batch(
                [scheduled[i].draft for i in verifying], logits[len(plain) :],
                [r.sampling_params for r in requests], [r.generator for r in requests],
                self.sample_buffer,
            )
            for i, tokens in zip(verifying, accepted):
                results[i] = tokens
        return out

    def _prompt_logprobs(self, scheduled, hidden: torch.Tensor, meta) -> list[PromptLogprobs | None]:
        """For the requests that asked: row j of a chunk starting at position p scores the
        prompt token at p + j + 1 (the last prompt row scores the first output: not a prompt
        logprob), in float32 log-softmax of the raw logits."""
        found: list[PromptLogprobs | None] = [None] * len(scheduled)
        asking = [i for i, s in enumerate(scheduled) if s.request.sampling_params.prompt_logprobs is not None]
        starts = meta.on_host().query_start_loc.tolist() if asking else None  # the host's copy: no read-back
        for i in asking:
            s = scheduled[i]
            k = s.request.sampling_params.prompt_logprobs
            end = min(s.num_computed_tokens + s.num_new_tokens, s.request.num_prompt_tokens - 1)
            if end <= s.num_computed_tokens:
                continue  # a decode step, or a chunk holding only the prompt's last token
            num_rows = end - s.num_computed_tokens
            logits = self.model.compute_logits(hidden[starts[i] : starts[i] + num_rows])  # (num_rows, V)
            targets = s.request.prompt_token_ids[s.num_computed_tokens + 1 : end + 1]
            chosen = upload(targets, logits.device, torch.long)
            logprobs = gather_logprobs(torch.log_softmax(logits.float(), dim=-1), chosen, k)
            found[i] = PromptLogprobs(s.num_computed_tokens + 1, logprobs)
        return found
