"""Mixture-of-Experts over a batch: the model groups a step's tokens by expert (stage 01's
moe/grouped.py), so each chosen expert's weights are read once per step, however many tokens
chose it; bytes_per_step.py counts what that reads per step as the batch grows."""
