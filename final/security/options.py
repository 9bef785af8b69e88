"""The door's command-line flags: keys (--api-key or VLLM_API_KEY), /metrics behind the key, TLS.

    python -m course.final serve --api-key sk-one --api-key sk-two     # or --api-key sk-one,sk-two
    VLLM_API_KEY=sk-one python -m course.final serve --host 0.0.0.0    # vLLM's variable, so its scripts work
    python -m course.final serve --ssl-keyfile key.pem --ssl-certfile cert.pem   # https://

Binding beyond the loopback without a key serves anyone who can reach the port: the server
says so when it starts.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from .api_key import Door

KEY_VARIABLE = "VLLM_API_KEY"


def add_door_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("access (final/security/)")
    g.add_argument("--api-key", action="append", metavar="KEY",
                   help="requests must send `Authorization: Bearer KEY` (all routes but /health and /metrics); "
                        f"repeat it or separate keys by commas; default: ${KEY_VARIABLE}, else no key")
    g.add_argument("--metrics-need-key", action="store_true", help="put /metrics behind the key too")
    g.add_argument("--ssl-keyfile", help="serve HTTPS: the private key (PEM), with --ssl-certfile")
    g.add_argument("--ssl-certfile", help="serve HTTPS: the certificate (PEM), with --ssl-keyfile")


def door_from_args(args: argparse.Namespace, environ=os.environ) -> Door:
    """The door the flags describe; ValueError for TLS files missing or given alone."""
    given = args.api_key or [environ.get(KEY_VARIABLE, "")]
    keys = tuple(k.strip() for value in given for k in value.split(",") if k.strip())
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together")
    for path in (args.ssl_keyfile, args.ssl_certfile):
        if path and not Path(path).is_file():
            raise ValueError(f"cannot read {path}")
    return Door(keys, args.metrics_need_key, args.ssl_keyfile, args.ssl_certfile)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def uvicorn_options(host: str, door: Door, log=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """What uvicorn.Config takes from the door (TLS files); warns when the port is open to all."""
    if not door.keys and not is_loopback(host):
        log(f"WARNING: serving on {host} without an API key: anyone who can reach this port can use the server "
            f"(set --api-key or ${KEY_VARIABLE})")
    return {"ssl_keyfile": door.ssl_keyfile, "ssl_certfile": door.ssl_certfile} if door.ssl_certfile else {}
