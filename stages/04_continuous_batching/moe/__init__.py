"""Mixture-of-Experts over a batch: the tokens of a step grouped by expert (grouped.py), so
each chosen expert's weights are read once per step and multiplied with all its rows in one
product, however many tokens chose it; bytes.py counts what that reads per step."""
