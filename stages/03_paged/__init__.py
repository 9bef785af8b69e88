"""Stage 03: paged KV cache. A pool of fixed-size blocks read through block tables, and
prefix caching: requests that share a prompt prefix share its blocks."""
