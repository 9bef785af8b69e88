"""Fuzz the door: hostile Authorization headers must get a 401, never a 5xx, never a hang.

    python -m course.final.stress.fuzz_headers                      # its own tiny server, key "sk-fuzz"
    python -m course.final.stress.fuzz_headers --url https://... --api-key KEY   # a running server

Every header of HOSTILE_HEADERS (missing, empty, malformed, huge, wrong scheme, wrong or
near-miss keys, unicode and raw bytes, repeated) is sent to every route a client can reach:
the OpenAI routes (with a valid body, so only the key can be wrong), /v1/models, /tokenize,
/detokenize, the dashboard's data routes, an unknown /v1 path. Each answer must be a 401 in OpenAI's shape
(`"code": "invalid_api_key"`), or a 4xx of the HTTP layer for a header it cannot parse, within
the deadline; /health must still answer. Last, the right key must get past the door everywhere.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import httpx

from .fuzz import CHAT, COMPLETIONS, USER, FuzzReport

ROUTES: list[tuple[str, str, dict | None]] = [
    ("POST", COMPLETIONS, {"prompt": "x", "max_tokens": 1}),
    ("POST", CHAT, {"messages": USER, "max_tokens": 1}),
    ("GET", "/v1/models", None),
    ("POST", "/tokenize", {"prompt": "x"}),
    ("POST", "/detokenize", {"tokens": [1]}),
    ("GET", "/v1/engine/state", None),
    ("GET", "/dashboard/workers", None),
    ("GET", "/dashboard/events", None),  # an endless stream once in: not in the right-key pass
    ("GET", "/v1/no-such-route", None),
    ("GET", "//v1/models", None),
]


def hostile_headers(key: str) -> list[tuple[str, list[tuple[bytes, bytes]]]]:
    """(name, raw headers) of requests that must not get in."""
    k = key.encode()
    auth = lambda value: [(b"authorization", value)]  # noqa: E731
    return [
        ("missing", []),
        ("empty", auth(b"")),
        ("scheme only", auth(b"Bearer")),
        ("lower-case scheme, wrong key", auth(b"bearer sk-wrong")),
        ("control bytes", auth(b"Bearer \x01\x02" + k)),
        ("basic scheme", auth(b"Basic " + k)),
        ("token scheme", auth(b"Token " + k)),
        ("no scheme", auth(k)),
        ("wrong key", auth(b"Bearer sk-wrong")),
        ("key prefix", auth(b"Bearer " + k[:-1])),
        ("key plus a byte", auth(b"Bearer " + k + b"x")),
        ("key twice", auth(b"Bearer " + k + b" " + k)),
        ("key in another header", [(b"x-api-key", k)]),
        ("key as a query", []),  # sent as ?api_key=KEY: never read
        ("utf-8 key", auth("Bearer ключ-é-🔑".encode())),
        ("latin-1 bytes", auth(b"Bearer \xe9\xff\xfe")),
        ("huge token", auth(b"Bearer " + b"a" * 60_000)),
        ("many headers", [(b"x-pad-%d" % i, b"v" * 100) for i in range(100)]),
        ("two authorizations, right one second", auth(b"Bearer sk-wrong") + auth(b"Bearer " + k)),
        ("tab separator", auth(b"Bearer\t" + k)),
    ]


def check(http: httpx.Client, name: str, method: str, route: str, body, headers, report: FuzzReport,
          deadline_s: float, want_in: bool, params: dict | None = None) -> None:
    report.cases += 1
    start = time.monotonic()
    try:
        r = http.request(method, route, headers=[(b"content-type", b"application/json"), *headers],
                         content=None if body is None else json.dumps(body).encode(), params=params,
                         timeout=deadline_s)
    except httpx.TimeoutException:
        report.hangs += 1
        report.violations.append(f"{name} {route}: no answer within {deadline_s} s")
        return
    except httpx.HTTPError as e:
        report.violations.append(f"{name} {route}: connection failed: {type(e).__name__}: {e}")
        return
    if time.monotonic() - start > report.slowest_s:
        report.slowest_s, report.slowest = time.monotonic() - start, f"{name} {route}"
    report.statuses[r.status_code] = report.statuses.get(r.status_code, 0) + 1
    if r.status_code >= 500:
        report.server_errors += 1
        report.violations.append(f"{name} {route}: {r.status_code}: {r.text[:200]}")
    elif want_in and r.status_code == 401:
        report.violations.append(f"{name} {route}: the right key was refused")
    elif not want_in and r.status_code == 401:
        try:
            err = r.json()["error"]
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error" and err["message"]
        except Exception:  # noqa: BLE001
            report.violations.append(f"{name} {route}: 401 not in OpenAI's shape: {r.text[:200]}")
    elif not want_in and not 400 <= r.status_code < 500:  # a header the HTTP layer refuses: 400/431
        report.violations.append(f"{name} {route}: got in without the key ({r.status_code})")


def run_header_fuzz(url: str, key: str, deadline_s: float = 30.0, verify=True) -> FuzzReport:
    report = FuzzReport()
    with httpx.Client(base_url=url, verify=verify) as http:
        for name, headers in hostile_headers(key):
            for method, route, body in ROUTES:
                query = {"api_key": key} if name == "key as a query" else None
                check(http, name, method, route, body, headers, report, deadline_s, want_in=False, params=query)
                if http.get("/health", timeout=10).status_code != 200:
                    report.violations.append(f"{name} {route}: /health not 200 afterwards")
        right = [(b"authorization", b"Bearer " + key.encode())]
        for method, route, body in ROUTES[:6]:
            check(http, "right key", method, route, body, right, report, deadline_s, want_in=True)
    return report


@contextlib.contextmanager
def tiny_server_with_key(key: str):
    from course.s01_decode_loop.testing import byte_tokenizer

    from ..security.api_key import Door
    from ..testing import running_server, tiny_engine
    tok = byte_tokenizer()
    with running_server(tiny_engine(tok, max_waiting=8), tok, door=Door((key,))) as (url, _):
        yield url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.final.stress.fuzz_headers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server started with --api-key (default: a tiny one here)")
    p.add_argument("--api-key", default="sk-fuzz", help="the server's key (the fuzz also sends near misses of it)")
    p.add_argument("--deadline", type=float, default=30.0)
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(tiny_server_with_key(args.api_key))
        report = run_header_fuzz(url, args.api_key, args.deadline)
    print(report.summary())
    for v in report.violations[:50]:
        print("  " + v[:500])
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
