"""Hostile and long-running clients for the server: a protocol fuzzer and a soak test."""
