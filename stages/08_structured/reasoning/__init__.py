"""Reasoning models: the thinking split from the answer (split.py), and a grammar that starts where
the thinking ends (gate.py).
(Absolute imports: pytest imports this file on its own when it collects the tests below it.)"""
from course.s08_structured.reasoning.gate import EndOfThinking, ThinkingGate, answer_reserve
from course.s08_structured.reasoning.split import PARSERS, ReasoningStream, ThinkingTags, split_reasoning, thinking_open

__all__ = ["PARSERS", "EndOfThinking", "ReasoningStream", "ThinkingGate", "ThinkingTags", "answer_reserve",
           "split_reasoning", "thinking_open"]
