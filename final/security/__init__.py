"""Who may use the server: API keys checked at the door (api_key.py) and the flags that set
them, /metrics' access and TLS (options.py)."""
