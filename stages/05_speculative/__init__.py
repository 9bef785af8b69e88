"""Stage 05: speculative decoding (draft model, prompt lookup, EAGLE) with exact verification."""
