"""Stage 02: the KV cache. Keys and values of past tokens are kept, so prefill runs the
prompt once and each decode step runs one token."""
