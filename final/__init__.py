"""The integrated engine behind an OpenAI-compatible server: `python -m course.final serve`."""
