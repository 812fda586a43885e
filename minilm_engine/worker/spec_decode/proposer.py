"""The draft model's side of speculative decoding: propose up to K tokens per request.

Contract: `DraftModelProposer.propose(requests, num_drafts)` returns, for each request, up to
`num_drafts[i]` tokens that may follow its tokens so far (with the draft's probabilities for
sampling requests).  The draft keeps its keys and values in its own paged cache, block pool and
block tables; `rollback(request)` drops what it computed for rejected tokens, `free(request_id)`
releases a request's blocks.  A round, for tokens t0..t9 (t9 not yet computed by the target),
K = 3, and a draft that has computed t0..t7:

    pass 1  catch up  feed t8 t9      (everything the draft has not seen)  -> d1
    pass 2            feed d1                                              -> d2
    pass 3            feed d2                                              -> d3

Each pass is one forward over all proposing requests.  d3's keys and values are computed by the
next round's catch-up (which also reads a new request's prompt, with the draft's own prefix
cache).  A request whose draft pool is short of blocks proposes fewer tokens this round.
"""

from __future__ import annotations

import torch

from minilm_engine.model.attention.backends import AttentionBackend
from minilm_engine.worker.input_batch import Chunk, InputBuffer, flatten_chunks
from minilm_engine.core.kv_cache_manager import BlockManager
from minilm_engine.core.block_pool import BlockPool
from minilm_engine.model.attention.context import PagedAttention
from minilm_engine.model.attention.kv_cache import PagedKVCache
from minilm_engine.model import CausalLM, load_model, resolve_model_path
from minilm_engine.model.device import device_context
from minilm_engine.core.request import Request
from minilm_engine.worker.sampler import sampling_probs
from minilm_engine.core.speculative_config import SpeculativeConfig, check_draft_fits_target
from minilm_engine.core.outputs import DraftTokens


def load_draft_model(config: SpeculativeConfig, target: CausalLM, target_tokenizer, max_model_len: int) -> CausalLM:
    """Load the draft named in `config` beside the target (same device and dtype), checked by
    `check_draft_fits_target`."""
    folder = resolve_model_path(config.model)
    draft = load_model(folder, dtype=target.dtype, device=target.device)
    draft_tokenizer = None
    if any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        from transformers import AutoTokenizer

        draft_tokenizer = AutoTokenizer.from_pretrained(str(folder))
    check_draft_fits_target(
        draft.config, target.config, draft_tokenizer, target_tokenizer, max_model_len,
        # from the shapes: a quantized model keeps its projection weights as buffers
        draft_num_parameters=draft.config.num_parameters(),
        target_num_parameters=target.config.num_parameters(),
    )
    return draft


def num_drafts_wanted(request: Request, num_speculative_tokens: int) -> int:
    """Tokens worth drafting: K, or m - 1 for a request with m tokens left to produce (a round
    yields up to drafts + 1 tokens)."""
    num_left = request.max_new_tokens - len(request.output_token_ids)
    return max(0, min(num_speculative_tokens, num_left - 1))


STOP_WINDOW = 8  # output tokens decoded before the drafts when looking for a stop string


def ends_request(request: Request, drafted: list[int], tokenizer=None) -> bool:
    """Whether the request would end at its last drafted token: a stop token or, given a
    tokenizer, a stop string the drafts complete (in the last few output tokens and the drafts).
    A shortcut only: the engine ends requests exactly when it appends the verified tokens."""
    if request.is_stop_token(drafted[-1]):
        return True
    stops = request.sampling_params.stop_strings
    if not stops or tokenizer is None:
        return False
    text = tokenizer.decode(request.output_token_ids[-STOP_WINDOW:] + drafted)
    return any(stop in text for stop in stops)


class DraftModelProposer:
    """Invariant: `num_computed_tokens[rid]` tokens of request rid have keys/values in the
    draft's cache, and its block table holds exactly the blocks they need after each round."""

    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        attention_backend: AttentionBackend | None = None,
        tokenizer=None,  # to stop drafting at a stop string (optional)
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.block_pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self.block_manager = BlockManager(self.block_pool, block_size, enable_prefix_caching)
        self.cache = PagedKVCache(model.config, num_blocks, block_size, model.dtype, model.device)
        self.attention_backend = attention_backend
        self.input_buffer = InputBuffer(model.device)  # every pass's inputs, reused (`input_batch.py`)
        self.num_computed_tokens: dict[str, int] = {}

    # -- a round ----------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, requests: list[Request], num_drafts: list[int]) -> list[DraftTokens]:
        """For each request, up to num_drafts[i] tokens to follow request.all_token_ids."""
        proposals = [DraftTokens([]) for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        # 1. Catch up: every token the draft has not computed yet, up to the request's last.
        active, chunks = [], []
        for i, request in enumerate(requests):
            if num_drafts[i] > 0:
                start = self._allocate_catch_up(request)
                if start is not None:
                    active.append(i)
                    chunks.append(self._chunk(request.request_id, request.all_token_ids[start:], start))
        while active:
            logits = self._forward(chunks)  # (len(active), V) at each chunk's last token
            best = logits.argmax(dim=-1).tolist()  # the greedy requests' drafts, in one call
            for row, i in enumerate(active):
                request = requests[i]
                token = best[row] if request.sampling_params.greedy else self._sample(logits[row], request, probs[i])
                proposals[i].token_ids.append(token)
            # 2. Feed each draft back for the next one, while a request wants more.
            next_active, chunks = [], []
            for i in active:
                request, drafted = requests[i], proposals[i].token_ids
                rid = request.request_id
                if len(drafted) >= num_drafts[i] or ends_request(request, drafted, self.tokenizer):
                    continue  # enough, or the request would end at this token anyway
                position = self.num_computed_tokens[rid]
                if not self.block_manager.allocate_slots(rid, position, 1):
                    continue  # draft pool short: propose what we have
                next_active.append(i)
                chunks.append(self._chunk(rid, [drafted[-1]], position))
            active = next_active
        for i, rows in enumerate(probs):
            if rows:
                proposals[i].probs = torch.stack(rows)  # (k, V)
        return proposals

    def _allocate_catch_up(self, request: Request) -> int | None:
        """Slots for the tokens the draft has not computed; returns where they start, or None
        when the draft's pool is short (the request then proposes nothing this round)."""
        rid, manager = request.request_id, self.block_manager
        if rid not in self.num_computed_tokens:
            # First round, or the first since a preemption: reuse the draft's own prefix cache.
            blocks, num_cached = manager.get_computed_blocks(
                request.all_token_ids, request.block_hashes.setdefault(manager.block_size, [])
            )
            if not manager.allocate_slots(rid, num_cached, request.num_tokens - num_cached, blocks):
                return None
            self.num_computed_tokens[rid] = num_cached
            return num_cached
        start = self.num_computed_tokens[rid]
        if not manager.allocate_slots(rid, start, request.num_tokens - start):
            return None
        return start

    def _sample(self, logits: torch.Tensor, request: Request, probs: list[torch.Tensor]) -> int:
        """logits: (V,) -> a sampling request's draft, drawn from q; q is kept for the target."""
        q = sampling_probs(logits, request.sampling_params)  # (V,)
        probs.append(q)
        return int(torch.multinomial(q, 1, generator=request.generator))

    def _chunk(self, request_id: str, token_ids: list[int], start: int) -> Chunk:
        """A chunk over the draft's own block table (its slots were allocated before)."""
        return Chunk(request_id, token_ids, start, self.block_manager.get_block_table(request_id))

    def _forward(self, chunks: list[Chunk]) -> torch.Tensor:
        """-> (num_chunks, V) logits at each chunk's last token; writes the draft's cache."""
        ids, pos, meta = flatten_chunks(chunks, self.block_manager.block_size, self.model.device,
                                        buffer=self.input_buffer)
        for chunk in chunks:
            self.num_computed_tokens[chunk.request_id] = chunk.end
        # Triton launches go to the *current* CUDA device (as in `ModelRunner.execute`): the draft's.
        with device_context(self.model.device):
            attn = PagedAttention(self.cache, meta, self.attention_backend)
            hidden = self.model(ids, pos, attn)  # (N, hidden)
            return self.model.compute_logits(hidden[meta.query_start_loc[1:] - 1])

    # -- after the target's verdict ---------------------------------------------------------

    def rollback(self, request: Request) -> None:
        """Keep only the draft's keys/values of tokens the request really has (the target's
        `num_computed_tokens`, accepted drafts included); full blocks join its prefix cache."""
        rid = request.request_id
        if rid not in self.num_computed_tokens:
            return
        num_valid = min(self.num_computed_tokens[rid], request.num_computed_tokens)
        self.num_computed_tokens[rid] = num_valid
        self.block_manager.commit(rid, request.all_token_ids, num_valid)
        self.block_manager.trim(rid, num_valid)

    def free(self, request_id: str) -> None:
        """Release the request's draft blocks (finished, aborted or preempted); idempotent."""
        if self.num_computed_tokens.pop(request_id, None) is not None:
            self.block_manager.free(request_id)
