"""What a server adds to the lesson's compiler: a budget for each compile (budget.py) and
answers that close before max_new_tokens runs out (closing.py)."""
