"""Stage 08: structured generation: grammars -> a byte-level pushdown automaton -> token masks."""
