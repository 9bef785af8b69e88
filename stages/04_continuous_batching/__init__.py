"""Stage 04: continuous batching. Many requests at different positions share every forward
pass; a scheduler admits, chunks, preempts and retires them at every iteration."""
