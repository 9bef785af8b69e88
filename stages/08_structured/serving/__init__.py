"""What a server adds to the lesson's masks: answers that close before max_new_tokens runs out
(closing.py's CloseOnBudget, plugged into GrammarLogitsProcessor's `narrow`)."""
