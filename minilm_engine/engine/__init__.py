"""The continuous-batching engine: scheduler, model runner, step trace."""

from .config import EngineConfig
from .llm_engine import LLMEngine
from .scheduler import Scheduler, SchedulerOutput
from .trace import StepRecord, StepTrace

__all__ = ["EngineConfig", "LLMEngine", "Scheduler", "SchedulerOutput", "StepRecord", "StepTrace"]
