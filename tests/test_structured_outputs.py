"""Structured outputs (vLLM's names, xgrammar's matcher): the grammar decides, the model fills in.

Whatever the (tiny, random) model prefers, the token mask forces a valid output: a choice is one
of the choices, a regex matches in full, JSON parses and validates.  Requests without a grammar
are untouched, token for token, even in a batch with constrained ones.  Each grammar compiles
once.  Bad specs fail at `SamplingParams`.  The server maps OpenAI's `response_format` and
vLLM's `structured_outputs` onto the same params (the openai SDK's `parse()` gets a valid
object back from the shipped model), and answers a bad grammar with a 400 naming the wire field.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import openai
import pytest
import torch
from pydantic import BaseModel, Field

from minilm_engine import LLM
from minilm_engine.course.experiments.server_thread import ServerThread
from minilm_engine.core.sampling_params import SamplingParams, StructuredOutputsParams
from minilm_engine.worker.structured_output import unpack_bitmask

# Short, bounded values: a random model would otherwise write a string until max_tokens.
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "dish": {"type": "string", "enum": ["ramen", "udon", "soba"]},
        "spicy": {"type": "boolean"},
        "bowls": {"type": "integer", "minimum": 1, "maximum": 9},
        "note": {"type": "string", "pattern": "^[a-z ]{0,8}$"},  # (xgrammar lets a free string hold raw control characters)
    },
    "required": ["dish", "spicy", "bowls", "note"],
    "additionalProperties": False,
}


def validate_order(order: object) -> None:
    """ORDER_SCHEMA's checks (jsonschema's, where it is installed)."""
    try:
        import jsonschema
    except ImportError:
        assert isinstance(order, dict) and list(order) == ["dish", "spicy", "bowls", "note"]
        assert order["dish"] in ("ramen", "udon", "soba") and isinstance(order["spicy"], bool)
        assert type(order["bowls"]) is int and 1 <= order["bowls"] <= 9
        assert re.fullmatch("[a-z ]{0,8}", order["note"])
        return
    jsonschema.validate(order, ORDER_SCHEMA)


PROMPTS = ["Order for table 7:", "Hello", "A bowl of noodles, please."]


@pytest.fixture(scope="module")
def llm(checkpoints):
    return LLM(checkpoints["llama"].path, record_trace=False)


def constrained(temperature: float = 0.0, max_tokens: int = 80, seed: int | None = 3, **grammar) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                          structured_outputs=StructuredOutputsParams(**grammar))


def texts(llm, params: SamplingParams) -> list[tuple[str, str]]:
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


# -- validation at the boundary ---------------------------------------------------------------


@pytest.mark.parametrize("kwargs, named", [
    ({}, "exactly one of json, json_object, regex, choice, grammar, got none"),
    ({"regex": "a+", "choice": ["a"]}, "got regex, choice"),
    ({"json": {"type": "foo"}}, "structured_outputs.json: a JSON schema"),
    ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
    ({"regex": "a("}, "structured_outputs.regex: a regular expression"),
    ({"grammar": "root ::= missing"}, "structured_outputs.grammar: a grammar"),
])
def test_bad_specs_fail_at_construction_naming_the_field(kwargs, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        StructuredOutputsParams(**kwargs)


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError, match="structured_outputs.choice"):
        StructuredOutputsParams(choice="ramen")
    with pytest.raises(TypeError, match="structured_outputs must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"regex": "a"})


def test_speculative_decoding_refuses_a_grammar(checkpoints):
    spec = LLM(checkpoints["llama"].path, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="structured_outputs is not supported with speculative decoding"):
        spec.generate("Hello", constrained(choice=["a", "b"]), use_tqdm=False)


# -- the mask forces valid outputs ---------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_choice_output_is_one_of_the_choices(llm, temperature):
    choices = ["ramen", "udon", "soba noodles"]
    for text, reason in texts(llm, constrained(temperature, choice=choices)):
        assert text in choices and reason == "stop"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_output_matches_in_full(llm, temperature):
    pattern = r"table [0-9]{1,2}: (ramen|udon) x[1-4]"
    for text, reason in texts(llm, constrained(temperature, regex=pattern)):
        assert re.fullmatch(pattern, text) and reason == "stop"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_parses_and_validates(llm, temperature):
    for text, reason in texts(llm, constrained(temperature, json=ORDER_SCHEMA, disable_any_whitespace=True)):
        assert reason == "stop", text
        validate_order(json.loads(text))


def test_json_object_output_is_an_object(llm):
    params = constrained(1.0, max_tokens=120, json_object=True, disable_any_whitespace=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    finished = [o.outputs[0].text for o in outputs if o.outputs[0].finish_reason == "stop"]
    assert finished  # a random model may nest until max_tokens; the ones that end must parse
    for text in finished:
        assert isinstance(json.loads(text), dict)


def test_a_finished_grammar_stops_even_with_ignore_eos(llm):
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    (out,) = llm.generate("Hello", params, use_tqdm=False)
    assert out.outputs[0].text in ("yes", "no") and out.outputs[0].finish_reason == "stop"
    assert len(out.outputs[0].token_ids) < 50


# -- compile once; the mask; the others untouched ----------------------------------------------


def test_each_grammar_is_compiled_once(llm):
    params = constrained(json=ORDER_SCHEMA, disable_any_whitespace=True, max_tokens=4)
    llm.generate(PROMPTS, params, use_tqdm=False)
    backend = llm.input_processor.structured_outputs.backend
    before = backend.num_compiled
    llm.generate(PROMPTS * 2, params, use_tqdm=False)  # six more requests, the same schema
    llm.generate("Hello", constrained(json=json.loads(json.dumps(ORDER_SCHEMA)), disable_any_whitespace=True,
                                      max_tokens=4), use_tqdm=False)  # an equal schema, another dict
    assert backend.num_compiled == before
    llm.generate("Hello", constrained(regex="[a-z]{3}", max_tokens=4), use_tqdm=False)
    assert backend.num_compiled == before + 1


def test_unpacked_bitmask_masks_as_xgrammar_does():
    xgr = pytest.importorskip("xgrammar")
    vocab_size = 100
    generator = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=generator)
    logits = torch.randn(3, 104, generator=generator)  # wider than the grammar's vocabulary
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask, vocab_size=vocab_size)
    want[:, vocab_size:] = float("-inf")  # ids the grammar does not know are never allowed
    allowed = unpack_bitmask(bitmask, 104)
    allowed[:, vocab_size:] = False
    got = logits.masked_fill(~allowed, float("-inf"))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_unconstrained_requests_are_token_exact_beside_constrained_ones(llm, temperature):
    plain = SamplingParams(temperature=temperature, seed=11, max_tokens=12, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, plain, use_tqdm=False)]
    grammars = [constrained(temperature, choice=["ramen", "udon"]),
                constrained(temperature, json=ORDER_SCHEMA, disable_any_whitespace=True),
                constrained(temperature, regex="[0-9]{2,5}")]
    mixed = llm.generate([p for p in PROMPTS for _ in range(2)],
                         [params for pair in zip([plain] * 3, grammars) for params in pair], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[::2]] == alone
    assert mixed[1].outputs[0].text in ("ramen", "udon")
    assert re.fullmatch("[0-9]{2,5}", mixed[5].outputs[0].text)


# -- the server: response_format, structured_outputs, the openai SDK's parse() ----------------


class Order(BaseModel):
    dish: Literal["ramen", "udon", "soba"]
    spicy: bool
    bowls: int = Field(ge=1, le=9)


NO_WHITESPACE = {"structured_outputs": {"disable_any_whitespace": True}}  # vLLM's option
CHAT = [{"role": "user", "content": "Two bowls of ramen, not spicy, please."}]


@pytest.fixture(scope="module")
def client():
    with ServerThread(LLM("noodle-chef", device="cpu", record_trace=False)) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_sdk_parse_returns_a_valid_object(client):
    for temperature in (0.0, 1.0):
        answer = client.chat.completions.parse(model="noodle-chef", messages=CHAT, response_format=Order,
                                               temperature=temperature, seed=5, max_tokens=60, extra_body=NO_WHITESPACE)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Order)
        assert Order.model_validate_json(choice.message.content) == choice.message.parsed


def test_response_format_json_object_and_text(client):
    answer = client.chat.completions.create(model="noodle-chef", messages=CHAT, response_format={"type": "json_object"},
                                            temperature=0, max_tokens=60, extra_body=NO_WHITESPACE)
    if answer.choices[0].finish_reason == "stop":  # the shipped model may nest until max_tokens
        assert isinstance(json.loads(answer.choices[0].message.content), dict)
    assert answer.choices[0].message.content.startswith("{")
    plain = client.chat.completions.create(model="noodle-chef", messages=CHAT, temperature=0, max_tokens=8)
    text = client.chat.completions.create(model="noodle-chef", messages=CHAT, temperature=0, max_tokens=8,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_vllms_structured_outputs_field_constrains_completions_and_chat(client):
    choices = ["ramen", "udon", "soba"]
    answer = client.completions.create(model="noodle-chef", prompt="Order for table 7:", max_tokens=10, temperature=1.0,
                                       n=3, seed=1, extra_body={"structured_outputs": {"choice": choices}})
    assert all(c.text in choices and c.finish_reason == "stop" for c in answer.choices)
    pattern = "table [0-9]{1,2}: (ramen|udon)"
    answer = client.chat.completions.create(model="noodle-chef", messages=CHAT, max_tokens=20, temperature=0,
                                            extra_body={"structured_outputs": {"regex": pattern}})
    assert re.fullmatch(pattern, answer.choices[0].message.content)


@pytest.mark.parametrize("body, param, says", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format", "response_format.json_schema.schema: a JSON schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format.type"),
    ({"structured_outputs": {"regex": "a("}}, "structured_outputs", "structured_outputs.regex: a regular expression"),
    ({"structured_outputs": {"grammar": "root ::= nothing"}}, "structured_outputs", "structured_outputs.grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "one grammar per request"),
])
def test_bad_grammars_get_a_400_naming_the_field(client, body, param, says):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="noodle-chef", messages=CHAT, max_tokens=5, extra_body=body)
    error = e.value.response.json()["error"]
    assert error["param"] == param and says in error["message"], error


# -- forced tool calls: tool_choice "required" or a named function -----------------------------

TOOLS = [
    {"type": "function", "function": {"name": "order", "description": "Order bowls of noodles.",
                                      "parameters": Order.model_json_schema()}},
    {"type": "function", "function": {"name": "pay", "parameters": {
        "type": "object", "properties": {"table": {"type": "integer", "minimum": 1, "maximum": 20}},
        "required": ["table"], "additionalProperties": False}}},
]


def test_a_named_tool_choice_returns_a_call_of_that_function(client):
    answer = client.chat.completions.create(
        model="noodle-chef", messages=CHAT, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "order"}},
        temperature=0, max_tokens=60, extra_body=NO_WHITESPACE)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "order" and call.id
    Order.model_validate_json(call.function.arguments)


def test_a_streamed_forced_call_comes_as_delta_tool_calls(client):
    kwargs = dict(model="noodle-chef", messages=CHAT, tools=TOOLS, temperature=0, max_tokens=60, extra_body=NO_WHITESPACE,
                  tool_choice={"type": "function", "function": {"name": "order"}})
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    chunks = [c.choices[0] for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
    calls = [call for c in chunks for call in c.delta.tool_calls or []]
    assert chunks[-1].finish_reason == "tool_calls" and {call.index for call in calls} == {0}
    assert calls[0].function.name == "order" and calls[0].id and calls[0].type == "function"
    assert "".join(call.function.arguments for call in calls) == whole.function.arguments
    assert not any(c.delta.content for c in chunks)


def test_a_required_tool_choice_returns_calls_of_known_functions(client):
    # parallel_tool_calls=False: one call (the shipped model, free to, keeps adding calls)
    answer = client.chat.completions.create(model="noodle-chef", messages=CHAT, tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, temperature=1.0, seed=2, max_tokens=120,
                                            extra_body=NO_WHITESPACE)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    for call in choice.message.tool_calls:
        arguments = json.loads(call.function.arguments)
        if call.function.name == "order":
            Order.model_validate(arguments)
        else:
            assert call.function.name == "pay" and 1 <= arguments["table"] <= 20


@pytest.mark.parametrize("changes, param, says", [
    ({"tool_choice": {"type": "function", "function": {"name": "dance"}}}, "tool_choice", "'dance', which is not in tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", "request's grammar"),
    ({"tool_choice": "sometimes"}, "tool_choice", 'tool_choice must be "none", "auto"'),
])
def test_tool_choices_this_server_cannot_follow_get_a_400(client, changes, param, says):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="noodle-chef", messages=CHAT, tools=TOOLS, max_tokens=5, **changes)
    error = e.value.response.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_a_speculating_server_refuses_a_grammar_with_a_400():
    llm = LLM("noodle-chef", device="cpu", record_trace=False,
              speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with ServerThread(llm) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="noodle-chef", messages=CHAT, max_tokens=5,
                                           extra_body={"structured_outputs": {"choice": ["a", "b"]}})
    error = e.value.response.json()["error"]
    assert error["param"] == "structured_outputs" and "speculative decoding" in error["message"], error


def test_auto_reads_the_calls_the_model_writes_and_history_replays(client):
    """tool_choice "auto" (the default with tools): the template shows the tools, and calls the
    model writes in its format come back as tool_calls; a round trip (the assistant's calls,
    then the tool's answer) renders, and the plain answer equals the unparsed text."""
    history = CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "order", "arguments": '{"dish": "ramen"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "cooking"}'},
    ]
    for stream in (False, True):
        got = client.chat.completions.create(model="noodle-chef", messages=history, tools=TOOLS, temperature=0,
                                             max_tokens=20, stream=stream)
        text = "".join(c.choices[0].delta.content or "" for c in got) if stream else got.choices[0].message.content
        plain = client.chat.completions.create(model="noodle-chef", messages=history, tools=TOOLS, tool_choice="auto",
                                               temperature=0, max_tokens=20)
        assert text == plain.choices[0].message.content  # the shipped model writes no calls of its own


def test_the_noodle_template_shows_tools_and_renders_calls_and_results():
    from transformers import AutoTokenizer

    from minilm_engine.entrypoints.chat_template import NOODLE_CHAT_TEMPLATE, ChatFormat, render_chat
    from minilm_engine.entrypoints.openai.tool_calls import read_tagged_tool_calls
    from minilm_engine.model.loader import CHECKPOINTS_DIR

    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINTS_DIR / "noodle-chef")
    messages = [{"role": "user", "content": "Ramen!"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "order", "arguments": {"dish": "ramen"}}}]},
                {"role": "tool", "content": "cooking"}]
    prompt = render_chat(tokenizer, ChatFormat(NOODLE_CHAT_TEMPLATE), messages, {"tools": TOOLS[1:]})
    assert prompt == ('Tool pay: {"type": "object", "properties": {"table": {"type": "integer", "minimum": 1, '
                      '"maximum": 20}}, "required": ["table"], "additionalProperties": false}\n'
                      'Ana: Ramen!\nSam: <tool_call>{"name": "order", "arguments": {"dish": "ramen"}}</tool_call>\n'
                      'Tool: cooking\nSam:')
    content, (call,) = read_tagged_tool_calls('Sure. <tool_call>{"name": "pay", "arguments": {"table": 4}}</tool_call>')
    assert content == "Sure." and call["function"] == {"name": "pay", "arguments": '{"table": 4}'}
    assert read_tagged_tool_calls("no calls here") is None
    assert read_tagged_tool_calls("<tool_call>{broken</tool_call>") is None


def test_the_engines_structured_outputs_config_makes_every_json_compact():
    """vLLM's --structured-outputs-config '{"disable_any_whitespace": true}': a client that cannot
    send the per-request option (the SDK's parse(), LangChain) still gets compact JSON."""
    llm = LLM("noodle-chef", device="cpu", record_trace=False, structured_outputs_config={"disable_any_whitespace": True})
    with ServerThread(llm) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        answer = client.chat.completions.parse(model="noodle-chef", messages=CHAT, response_format=Order,
                                               temperature=0, max_tokens=60)
    assert isinstance(answer.choices[0].message.parsed, Order)
    assert "\n" not in answer.choices[0].message.content
    with pytest.raises(ValueError, match="unknown keys"):
        LLM("noodle-chef", device="cpu", structured_outputs_config={"whitespace": False})


def test_the_serve_flag_reaches_the_engine():
    import argparse

    from minilm_engine.entrypoints.cli.serve import add_engine_arguments, llm_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    add_engine_arguments(parser)
    args = parser.parse_args(["noodle-apprentice", "--device", "cpu", "--kv-cache-memory", str(8 << 20),
                              "--structured-outputs-config", '{"disable_any_whitespace": true}'])
    assert llm_from_args(args).input_processor.structured_outputs.config.disable_any_whitespace
