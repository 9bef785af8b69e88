"""What evaluation harnesses send to a completions server, served.

* fields.py: the request fields (prompt as text, token ids or lists of either; echo;
  max_tokens 0; prompt_logprobs), mixed into protocol.py's bodies;
* prompt_logprobs.py: the engine side, the prompt's logprobs taken from the prefill's rows;
* completions.py: the route side, one request per prompt, their choices put together;
* tokens.py: /tokenize and /detokenize as vLLM serves them.
"""
