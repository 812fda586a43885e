"""Tests for minilm_engine.worker.model_runner and its input buffers: a step the GPU need not wait on.

What a GPU step must not do is checked here on the CPU, where it is cheap to count:

- the step's inputs go through buffers allocated once (`InputBuffer`): the same storage every
  step, values exactly those of fresh tensors;
- the forward pass of the torch backend reads nothing back from the device (the metadata's
  host copies serve the plan), and a whole greedy decode step reads back once: its tokens;
- the same tokens as before, however the steps are split (the engine tests check that at
  length; here a run with chunks, decodes and prompt logprobs side by side).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

from minilm_engine import LLM, SamplingParams
from minilm_engine.model.attention.paged import PagedAttentionMetadata
from minilm_engine.worker.input_batch import Chunk, InputBuffer, flatten_chunks

# Every way a tensor's values reach the host.  On a GPU each one waits for the kernels queued
# before it; on a CPU they are free, so the tests count calls instead of timing them.
READ_BACKS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


@contextmanager
def count_read_backs(monkeypatch):
    """-> a dict, method name -> calls made on any tensor inside the block."""
    calls = {name: 0 for name in READ_BACKS}
    with monkeypatch.context() as patch:
        for name in READ_BACKS:
            original = getattr(torch.Tensor, name)

            def counted(self, *args, _original=original, _name=name, **kwargs):
                calls[_name] += 1
                return _original(self, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counted)
        yield calls


def decoding_engine(path, num_requests: int, **engine_args):
    """An engine whose `num_requests` greedy requests have all reached decode."""
    llm = LLM(path, max_model_len=128, block_size=4, **engine_args)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(str(i), {"prompt_token_ids": [(7 * i + j) % 300 + 5 for j in range(5 + 3 * i)]}, params)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.requests.values()):
        engine.step()
    return engine


# ------------------------------------------------------------------------------- InputBuffer


def test_upload_gives_the_arrays_back_as_tensors_of_their_shapes():
    buffer = InputBuffer("cpu", size=4)
    arrays = [np.arange(5), np.array([[7, 8, 9], [1, 2, 3]]), np.zeros(0, dtype=np.int64), np.array([-4])]
    tensors = buffer.upload(arrays)
    assert [t.shape for t in tensors] == [a.shape for a in arrays]
    assert all(t.dtype == torch.int64 and t.tolist() == a.tolist() for t, a in zip(tensors, arrays))
    assert buffer.host.shape[0] >= 12  # grown to fit the 12 numbers


def test_a_buffer_is_allocated_once_and_reused():
    buffer = InputBuffer("cpu", size=64)
    first = buffer.upload([np.arange(10), np.arange(3)])
    storage = first[0].untyped_storage().data_ptr()
    second = buffer.upload([np.arange(20, 50), np.arange(6)])
    assert second[0].untyped_storage().data_ptr() == storage  # no allocation: the same memory
    assert second[0].tolist() == list(range(20, 50)) and second[1].tolist() == list(range(6))
    # On a CPU the host array is the device's: nothing is copied, nothing is pinned.
    assert buffer.on_device is buffer.host and not buffer.host.is_pinned()


def test_flatten_through_a_buffer_equals_flatten_into_fresh_tensors():
    tables = {"a": [3, 9], "b": [5, 1, 4], "c": [2]}
    buffer = InputBuffer("cpu", size=2)  # too small: it grows on the first step
    for steps in ([("a", [11, 12, 13], 2), ("b", [14], 9), ("c", [15, 16], 0)], [("b", [17], 10), ("a", [18], 5)]):
        chunks = [Chunk(r, t, s, tables[r]) for r, t, s in steps]
        fresh = flatten_chunks(chunks, 4, torch.device("cpu"))
        reused = flatten_chunks(chunks, 4, torch.device("cpu"), buffer=buffer)
        for a, b in zip(fresh[:2] + tuple(vars(fresh[2]).values()), reused[:2] + tuple(vars(reused[2]).values())):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        # The host copies are what was uploaded.
        host = reused[2].host
        assert host.query_start_loc.tolist() == reused[2].query_start_loc.tolist()
        assert host.context_lens.tolist() == reused[2].context_lens.tolist()
        assert host.block_tables.tolist() == reused[2].block_tables.tolist()


def test_metadata_without_host_copies_reads_them_back():
    meta = PagedAttentionMetadata(torch.tensor([5]), torch.tensor([0, 1]), torch.tensor([6]), torch.tensor([[1, 0]]))
    host = meta.on_host()
    assert host.query_start_loc.tolist() == [0, 1] and host.context_lens.tolist() == [6]
    assert host.block_tables.tolist() == [[1, 0]] and host.num_queries.tolist() == [1]


# ------------------------------------------------------------------------------- the runner


def test_the_runner_reuses_its_input_storage_from_step_to_step(checkpoints):
    engine = decoding_engine(checkpoints["qwen3"].path, num_requests=4)
    runner = engine.runner
    seen = []
    prepare = runner.prepare

    def recording_prepare(sched):
        input_ids, positions, meta = prepare(sched)
        seen.append({t.untyped_storage().data_ptr() for t in (input_ids, positions, *vars(meta).values())
                     if isinstance(t, torch.Tensor)})
        return input_ids, positions, meta

    runner.prepare = recording_prepare
    for _ in range(6):
        engine.step()
    assert len(seen) == 6 and all(s == seen[0] for s in seen)
    assert seen[0] == {runner.input_buffer.on_device.untyped_storage().data_ptr()}  # one buffer, all of them


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("num_requests", [1, 5])
def test_the_torch_backend_forward_reads_nothing_back(checkpoints, monkeypatch, num_requests, backend):
    """The plan comes from the metadata's host copies: inside the forward pass (planning and
    every layer) no tensor is read back, where the plan once read three (`.cpu()` of the
    offsets, the lengths and the tables)."""
    engine = decoding_engine(checkpoints["qwen3"].path, num_requests=num_requests, attention_backend=backend)
    assert engine.attention_backend.name == backend
    model = engine.runner.model
    forward = model.forward
    counts = []

    def guarded_forward(*args, **kwargs):
        with count_read_backs(monkeypatch) as calls:
            out = forward(*args, **kwargs)
        counts.append(calls)
        return out

    # the attention context (and so the plan) is built before the forward: guard it too
    from minilm_engine.worker import model_runner

    make_context = model_runner.PagedAttention

    def guarded_context(*args, **kwargs):
        with count_read_backs(monkeypatch) as calls:
            context = make_context(*args, **kwargs)
        counts.append(calls)
        return context

    monkeypatch.setattr(model, "forward", guarded_forward)
    monkeypatch.setattr(model_runner, "PagedAttention", guarded_context)
    engine.step()
    engine.add_request("late", {"prompt_token_ids": list(range(10, 30))}, SamplingParams(temperature=0, max_tokens=3))
    engine.step()  # a prompt beside the decodes: both groups of the plan
    assert len(counts) == 4
    assert all(sum(c.values()) == 0 for c in counts), counts


def test_a_greedy_decode_step_reads_back_once(checkpoints, monkeypatch):
    engine = decoding_engine(checkpoints["qwen3"].path, num_requests=6)
    for _ in range(3):
        with count_read_backs(monkeypatch) as calls:
            outputs = engine.step()
        assert len(outputs) == 6
        assert calls == {**dict.fromkeys(READ_BACKS, 0), "tolist": 1}, calls  # the sampled tokens
