"""Chapter 11's exercise: the token mask of a `choice` grammar, written by hand.

    choice_mask_exercise   write `allowed_next_tokens(choices, text, pieces, stop_token_ids)`:
                           the ids that may come next when the output so far is `text` and it
                           must end as one of `choices`.  The checker walks random prefixes
                           through the engine's own grammar (xgrammar, `core/structured_output/`)
                           and compares your set with the engine's bitmask at every step, naming
                           the first token you allow and should not, or miss.

`pieces[i]` is the text token i adds (`tokenizer.decode([i])`; a special token decodes to its name, e.g. "<|endoftext|>", and starts no choice).
"""

from __future__ import annotations

import random

import torch

from minilm_engine.course.teaching.exercises import CheckResult

CHOICE_SETS = (
    ["ramen", "udon", "soba"],
    ["yes", "no"],
    ["shoyu ramen", "miso ramen", "shio ramen", "tonkotsu ramen"],
    ["1", "12", "123"],
    ["spicy", "mild", "extra spicy"],
)

HINT = ("A token may come next when the text so far plus the token's piece is still the start of "
        "some choice (str.startswith). Tokens whose piece is empty add nothing: never allow them. "
        "When the text already equals a choice, the stop token may come next too (and a longer "
        "choice may still continue it: '1' then '12').")


def engine_allowed(llm, choices: list[str], token_ids: list[int]) -> set[int]:
    """The engine's mask after `token_ids`: the set bits of the grammar's bitmask row."""
    from minilm_engine import SamplingParams
    from minilm_engine.core.sampling_params import StructuredOutputsParams
    from minilm_engine.worker.structured_output import unpack_bitmask

    manager = llm.input_processor.structured_outputs
    grammar = manager.new_grammar(SamplingParams(structured_outputs=StructuredOutputsParams(choice=choices)))
    for token in token_ids:
        assert grammar.accept_token(token), f"token {token} was not allowed"
    vocab_size = llm.config.vocab_size
    bitmask = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)
    grammar.fill_bitmask(bitmask, 0)
    return set(unpack_bitmask(bitmask, vocab_size)[0].nonzero().flatten().tolist())


class ChoiceMaskExercise:
    name = "allowed_next_tokens"

    def hint(self) -> str:
        return HINT

    def check(self, fn, llm=None, num_cases: int = 30, seed: int = 0) -> CheckResult:
        """Run `fn` on `num_cases` random prefixes against the engine's mask."""
        if not callable(fn):
            return CheckResult(False, 0, f"{self.name}: pass your function itself, got {fn!r}")
        if llm is None:
            from minilm_engine import LLM
            llm = LLM("noodle-chef", device="cpu", record_trace=False)
        tokenizer = llm.tokenizer
        pieces = [tokenizer.decode([i]) for i in range(llm.config.vocab_size)]
        stop = tuple(llm.input_processor.structured_outputs.stop_token_ids)
        rng = random.Random(seed)
        for case in range(num_cases):
            choices = list(rng.choice(CHOICE_SETS))
            token_ids: list[int] = []
            for _ in range(rng.randint(0, 4)):  # a random walk through what the engine allows
                nexts = sorted(engine_allowed(llm, choices, token_ids) - set(stop))
                if not nexts:
                    break
                token_ids.append(rng.choice(nexts))
            text = "".join(pieces[t] for t in token_ids)
            want = engine_allowed(llm, choices, token_ids)
            try:
                got = {int(t) for t in fn(list(choices), text, pieces, stop)}
            except Exception as error:  # the learner's bug, shown as a message
                return CheckResult(False, case, f"{self.name}({choices}, {text!r}) raised {error!r}")
            if got == want:
                continue
            where = f"choices {choices}, text so far {text!r}"
            extra, missing = sorted(got - want), sorted(want - got)
            if extra:
                t = extra[0]
                why = ("a stop token, but the text is not a complete choice yet" if t in stop
                       else "a token whose piece is empty: it adds no text" if not pieces[t]
                       else f"{text + pieces[t]!r} starts no choice")
                message = f"{where}: you allow token {t} ({pieces[t]!r}), {why}."
            else:
                t = missing[0]
                why = ("the text is a complete choice, so the stop token must be allowed" if t in stop
                       else f"{text + pieces[t]!r} still starts a choice (tokens can span several characters)")
                message = f"{where}: you miss token {t} ({pieces[t]!r}): {why}."
            return CheckResult(False, case, message + f" ({len(missing)} missed, {len(extra)} extra.) Hint: {HINT}")
        return CheckResult(True, num_cases, f"{self.name}: your mask equals the engine's on {num_cases} random prefixes.")


choice_mask_exercise = ChoiceMaskExercise()
