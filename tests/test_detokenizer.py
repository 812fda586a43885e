"""Tests for minilm_engine.entrypoints.detokenizer and the output processor that runs it:
incremental text equals decoding everything at once, and stop strings are found in it.

Random token ids are the hard case: byte-level tokenizers then produce bytes that are not valid
UTF-8, characters split over tokens, and special tokens that decode to nothing.  Two tokenizer
styles are checked, both real `tokenizers` objects: byte-level BPE (Llama 3, Qwen; the test
session's tokenizer) and a SentencePiece-style Metaspace BPE (Llama 2, Mistral), whose decoder
drops the leading space of the first token of every `decode` call.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from minilm_engine.core.request import Request
from minilm_engine.entrypoints.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from minilm_engine.entrypoints.output_processor import OutputProcessor
from minilm_engine.core.sampling_params import SamplingParams

TEXTS = [
    "Miso ramen, two bowls. 味噌ラーメン二つ！ Extra egg 🥚 and chili 🌶️, total $31.50",
    "Café crème · naïve façade — «quoted» 面条 and 饺子 to go",
] * 20


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"], show_progress=False)
    tok.train_from_iterator(TEXTS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module")
def tokenizers(tokenizer):
    return {"byte-level": tokenizer, "metaspace": metaspace_tokenizer()}


def decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=True)


def check_incremental(tokenizer, ids):
    detok, text, seen = IncrementalDetokenizer(), "", []
    for token in ids:
        seen.append(token)
        text += detok.step(tokenizer, seen)
        full = decode(tokenizer, seen)
        assert full.startswith(text), (seen, text, full)
        if not full.endswith(REPLACEMENT_CHAR):
            assert text == full, (seen, text, full)  # nothing held back unless a character is unfinished
    assert text + detok.flush(tokenizer, seen) == decode(tokenizer, seen)


@pytest.mark.parametrize("style", ["byte-level", "metaspace"])
def test_real_text_comes_out_token_by_token(tokenizers, style):
    tok = tokenizers[style]
    for text in TEXTS[:2]:
        ids = tok.encode(text, add_special_tokens=False)
        check_incremental(tok, ids)
        detok, seen, out = IncrementalDetokenizer(), [], ""
        for token in ids:
            seen.append(token)
            out += detok.step(tok, seen)
        assert out == decode(tok, ids)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("style", ["byte-level", "metaspace"])
def test_random_ids_equal_decoding_all_at_once(tokenizers, style, data):
    tok = tokenizers[style]
    ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=40))
    check_incremental(tok, ids)


def test_a_split_character_is_held_back_until_complete(tokenizer):
    ids = tokenizer.encode("a🥚", add_special_tokens=False)
    # The tokenizer was trained on text without eggs: "🥚" (4 bytes) is several byte tokens.
    assert decode(tokenizer, ids[:2]).endswith(REPLACEMENT_CHAR)
    detok, seen, pieces = IncrementalDetokenizer(), [], []
    for token in ids:
        seen.append(token)
        pieces.append(detok.step(tokenizer, seen))
    assert pieces[0] == "a" and pieces[-1] == "🥚" and set(pieces[1:-1]) == {""}


def make_request(**params) -> Request:
    return Request("r", None, [1, 2, 3], SamplingParams(temperature=0, **params), eos_token_ids=(0,),
                   max_model_len=1000)


def append(processor: OutputProcessor, request: Request, tokens: list[int]) -> None:
    """One engine step's tail: the scheduler appends the ids, then the output processor runs
    and a stop string it finds ends the request (as `LLMEngine.step` does)."""
    for token in tokens:
        request.append_output_token(token)
        if request.finished:
            break
    for match in processor.process([request]):
        match.request.stop_on_string(match.stop, match.num_output_tokens)


@pytest.mark.parametrize("style", ["byte-level", "metaspace"])
def test_request_text_is_decode_of_its_tokens_when_it_ends(tokenizers, style):
    tok = tokenizers[style]
    ids = tok.encode(TEXTS[0], add_special_tokens=False)
    request = make_request(max_tokens=len(ids) - 1)  # ends by length one token short
    processor = OutputProcessor(tok)
    for token in ids[: len(ids) - 1]:
        append(processor, request, [token])
    assert request.finish_reason == "length"
    assert request.output_text == decode(tok, ids[:-1])
    assert request.all_token_ids == [1, 2, 3] + ids[:-1]


def test_unfinished_character_at_the_end_shows_as_decode_shows_it(tokenizer):
    # Cut "🥚" after its first byte token(s): decode shows U+FFFD, and so does the request.
    egg = tokenizer.encode("🥚", add_special_tokens=False)
    ids = tokenizer.encode("ok ", add_special_tokens=False) + egg[:-1]
    if decode(tokenizer, ids).endswith(REPLACEMENT_CHAR) is False:
        pytest.skip("this tokenizer has '🥚' as a single token")
    request, processor = make_request(max_tokens=len(ids)), OutputProcessor(tokenizer)
    for token in ids:
        append(processor, request, [token])
    assert request.output_text == decode(tokenizer, ids)


def test_stop_string_spanning_tokens_is_found_and_cut(tokenizer):
    ids = tokenizer.encode("Total: $31.50 thanks", add_special_tokens=False)
    request, processor = make_request(max_tokens=100, stop=["31.5"]), OutputProcessor(tokenizer)
    for token in ids:
        append(processor, request, [token])
        if request.finished:
            break
    assert request.finish_reason == "stop" and request.stop_reason == "31.5"
    assert request.output_text == "Total: $"
    # Token ids keep the token that completed the string, and nothing after it.
    assert "31.5" in decode(tokenizer, request.output_token_ids)
    assert "31.5" not in decode(tokenizer, request.output_token_ids[:-1])


def test_a_stop_string_inside_a_steps_tokens_drops_the_ones_after_it(tokenizer):
    # Speculative decoding appends several tokens in one step: a stop string completed by one
    # of them ends the request at that token, text and ids alike.
    ids = tokenizer.encode("Total: $31.50 thanks", add_special_tokens=False)
    whole = make_request(max_tokens=100, stop=["31.5"])
    append(OutputProcessor(tokenizer), whole, ids)
    one_by_one, processor = make_request(max_tokens=100, stop=["31.5"]), OutputProcessor(tokenizer)
    for token in ids:
        append(processor, one_by_one, [token])
        if one_by_one.finished:
            break
    assert whole.output_token_ids == one_by_one.output_token_ids != ids
    assert whole.output_text == one_by_one.output_text == "Total: $"
    assert whole.stop_reason == "31.5" and len(whole.metrics.token_times) == len(whole.output_token_ids)


def test_a_stop_token_ends_the_request_before_a_stop_string_it_completes(tokenizer):
    ids = tokenizer.encode("Total: $31.50", add_special_tokens=False)
    last = next(k for k in range(len(ids)) if "31.5" in decode(tokenizer, ids[: k + 1]))
    request = make_request(max_tokens=100, stop=["31.5"], stop_token_ids=[ids[last]])
    append(OutputProcessor(tokenizer), request, ids)
    assert request.stop_reason == ids[last] and request.output_token_ids == ids[: last + 1]


@pytest.mark.parametrize("style", ["byte-level", "metaspace"])
def test_text_decoded_once_at_the_end_is_the_same(tokenizers, style):
    tok = tokenizers[style]
    ids = tok.encode(TEXTS[1], add_special_tokens=False)
    request, processor = make_request(max_tokens=len(ids)), OutputProcessor(tok)
    request.incremental_text = False
    for token in ids:
        assert request.output_text == ""  # nothing decoded while it runs
        append(processor, request, [token])
    assert request.finished and request.output_text == decode(tok, ids)


def test_stop_strings_keep_the_text_incremental(tokenizer):
    ids = tokenizer.encode("Total: $31.50 thanks", add_special_tokens=False)
    request, processor = make_request(max_tokens=100, stop=["31.5"]), OutputProcessor(tokenizer)
    request.incremental_text = False
    for token in ids:
        append(processor, request, [token])
        if request.finished:
            break
    assert request.stop_reason == "31.5" and request.output_text == "Total: $"
