"""Compiled masks: classify_position's walk in C (walker.py, walk.c), for the server's first requests."""
