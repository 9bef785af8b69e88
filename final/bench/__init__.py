"""The server's and engine's benchmarks: peers side by side, in-process profiles, precision,
speculation under load, and an OpenAI-API load client. Each runs as `python -m course.final.bench.NAME`."""
