"""The integrated engine behind an OpenAI-compatible server (work in progress: see issue 6)."""
