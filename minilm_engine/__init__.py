"""minilm-engine: a small but real LLM inference engine for learning how serving works.

    from minilm_engine import LLM, SamplingParams
    llm = LLM()                                   # the shipped noodle-shop model, offline
    out = llm.generate("Order for table 7:", SamplingParams(temperature=0, max_tokens=40))
    print(out[0].outputs[0].text)
"""

from minilm_engine.entrypoints.llm import LLM
from minilm_engine.core.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minilm_engine.core.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "CompletionOutput", "RequestMetrics", "RequestOutput", "SamplingParams", "StructuredOutputsParams"]
__version__ = "0.1.0"
