"""Stage 01: the decode loop. A Llama-family model from scratch, sampling, detokenizing,
stop conditions, and the naive loop that recomputes everything at every step."""
