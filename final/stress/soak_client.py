"""The soak's requests (course.final.stress.soak): the workload drawn from a seed, the clients that
send it (some hang up, some give up) and read the answers, and the checks on one answer."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import httpx

PROMPTS = ["Hello", "Once upon a time", "The capital of France", "List three colors:", "def add(a, b):",
           "Why is the sky blue?", "1, 2, 3, 4,", "Tell me a joke.", "Name a fruit.", "Write a haiku.",
           "What is 2+2?", "Say hi twice."]  # short: with the tiny byte model each character is a token
STOPS = [".", "\n", " the", "e"]


# ---- the workload -------------------------------------------------------------------------
@dataclass
class Job:
    """One planned request: the body, and how its client behaves."""
    index: int
    route: str                         # "completions" or "chat"
    body: dict
    hang_up_after: int | None = None   # a stream: close it after this many chunks
    give_up_s: float | None = None     # not a stream: the client's timeout

    @property
    def n(self) -> int:
        return self.body.get("n", 1)

    @property
    def stream(self) -> bool:
        return self.body.get("stream", False)

    def label(self) -> str:
        how = "greedy" if self.body["temperature"] == 0 else f"seed={self.body['seed']}"
        return f"#{self.index} {self.route} {'stream' if self.stream else 'whole'} n={self.n} {how}"


def plan(requests: int, seed: int, max_tokens: int = 48, give_up_max: float = 0.3) -> list[Job]:
    """Every request and client behaviour, drawn up front from `seed` (a run is reproducible)."""
    rng = random.Random(seed)
    return [plan_one(rng, i, max_tokens, give_up_max) for i in range(requests)]


def plan_one(rng: random.Random, index: int, max_tokens: int, give_up_max: float) -> Job:
    route, prompt = rng.choice(["completions", "chat"]), rng.choice(PROMPTS)
    body = {"prompt": prompt} if route == "completions" else {"messages": [{"role": "user", "content": prompt}]}
    # chat takes either name for the length; exercise both
    length_key = "max_completion_tokens" if route == "chat" and rng.random() < 0.5 else "max_tokens"
    body |= {length_key: rng.randint(min(4, max_tokens), max_tokens), "n": rng.choices([1, 2, 3], [6, 3, 2])[0],
             "temperature": 0.0}
    if rng.random() < 0.5:  # seeded sampling: reproducible, so it can be compared like greedy
        body |= {"temperature": 0.8, "seed": rng.randrange(2**31)}
    if rng.random() < 0.25:
        body["stop"] = rng.choice(STOPS)
    if rng.random() < 0.4:
        body["ignore_eos"] = True  # with no stop string: exactly max_tokens tokens per choice
    job = Job(index, route, body)
    if rng.random() < 0.5:
        body["stream"] = True
        if rng.random() < 0.7:
            body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.2:  # a client that hangs up mid-stream (exact length: it cannot end first)
            job.hang_up_after = rng.randint(1, max(1, body[length_key] // 2))
            body["ignore_eos"] = True
            body.pop("stop", None)
    elif rng.random() < 0.2:  # a client that gives up before a long answer is ready
        job.give_up_s = rng.uniform(0.01, give_up_max)
        body |= {length_key: max_tokens, "ignore_eos": True}
        body.pop("stop", None)
    return job


# ---- one client ---------------------------------------------------------------------------
@dataclass
class Answer:
    """What a client got back, per choice index."""
    stream: bool = False                # sent with "stream": true
    status: int | None = None
    texts: dict[int, str] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    chunks: dict[int, int] = field(default_factory=dict)  # streams: token chunks (one per token)
    usage: dict | None = None
    done: bool = False                  # a stream: `data: [DONE]` came
    abandoned: str | None = None        # "disconnected" or "gave up": the client left on purpose
    problems: list[str] = field(default_factory=list)


async def send(http: httpx.AsyncClient, job: Job, replay: bool = False) -> Answer:
    """Send the job as its client would; or (`replay`) its body unstreamed, waiting for the end."""
    ans, path = Answer(), "/v1/completions" if job.route == "completions" else "/v1/chat/completions"
    body = {k: v for k, v in job.body.items() if k not in ("stream", "stream_options")} if replay else job.body
    ans.stream = body.get("stream", False)
    try:
        if ans.stream:
            await read_stream(http, path, body, job.hang_up_after, ans)
        else:
            read_whole(await http.post(path, json=body, timeout=None if replay else job.give_up_s), ans)
    except httpx.TimeoutException:
        ans.abandoned = "gave up"  # only a give-up job has a timeout; httpx closes the connection
    except httpx.HTTPError as e:
        ans.problems.append(f"transport error {type(e).__name__}: {e}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # not OpenAI's shape: a server bug too
        ans.problems.append(f"malformed answer: {type(e).__name__}: {e}")
    return ans


def read_whole(r: httpx.Response, ans: Answer) -> None:
    ans.status = r.status_code
    if r.status_code != 200:
        return ans.problems.append(f"HTTP {r.status_code}: {r.text[:200]}")
    data = r.json()
    for c in data["choices"]:
        ans.texts[c["index"]] = c["text"] if "text" in c else c["message"]["content"]
        ans.finish[c["index"]] = c["finish_reason"]
    ans.usage = data.get("usage")


async def read_stream(http: httpx.AsyncClient, path: str, body: dict, hang_up_after: int | None,
                      ans: Answer) -> None:
    async with http.stream("POST", path, json=body) as r:
        ans.status = r.status_code
        if r.status_code != 200:
            return ans.problems.append(f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}")
        seen = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if ans.done:
                ans.problems.append(f"data after [DONE]: {line[:80]}")
            elif line == "data: [DONE]":
                ans.done = True
            else:
                read_chunk(json.loads(line[6:]), ans)
                seen += 1
                if seen == hang_up_after:
                    ans.abandoned = "disconnected"  # leaving the `async with` closes the connection
                    return


def read_chunk(chunk: dict, ans: Answer) -> None:
    if "error" in chunk:
        return ans.problems.append(f"error event: {chunk['error']}")
    if chunk.get("usage") and not chunk["choices"]:
        ans.usage = chunk["usage"]
    for c in chunk["choices"]:
        i = c["index"]
        if ans.finish.get(i) is not None:
            ans.problems.append(f"choice {i} has a chunk after its finish_reason")
        text = c["text"] if "text" in c else c["delta"].get("content") or ""
        ans.texts[i] = ans.texts.get(i, "") + text
        ans.chunks[i] = ans.chunks.get(i, 0) + 1
        ans.finish[i] = c["finish_reason"]


# ---- the checks ---------------------------------------------------------------------------
def check_complete(job: Job, ans: Answer, allow_429: bool = False) -> list[str]:
    """Check 1 (and the usage a stream can check alone): one complete, well-formed answer."""
    if ans.status == 429 and allow_429:
        return []
    problems = list(ans.problems)
    if ans.status != 200 or problems:
        return problems or [f"HTTP {ans.status}"]
    if ans.stream and not ans.done:
        problems.append("the stream ended without data: [DONE]")
    if sorted(ans.texts) != list(range(job.n)):
        problems.append(f"choices {sorted(ans.texts)}, expected 0..{job.n - 1}")
    problems += [f"choice {i} has no finish_reason" for i, f in ans.finish.items() if f not in ("stop", "length")]
    wants_usage = not ans.stream or job.body.get("stream_options", {}).get("include_usage")
    if wants_usage and not ans.usage:
        return problems + ["no usage"]
    if ans.stream and wants_usage and ans.usage["completion_tokens"] != sum(ans.chunks.values()):
        problems.append(f"usage says {ans.usage['completion_tokens']} tokens, {sum(ans.chunks.values())} streamed")
    if job.body.get("ignore_eos") and "stop" not in job.body:  # the length is exact
        want = job.body.get("max_tokens") or job.body.get("max_completion_tokens")
        tokens = set(ans.chunks.values()) if ans.stream else {ans.usage["completion_tokens"] / job.n}
        if any(f != "length" for f in ans.finish.values()) or tokens != {want}:
            problems.append(f"ignore_eos: expected {want} tokens per choice, got {ans.chunks or ans.finish}")
    return problems


def compare(job: Job, soak: Answer, alone: Answer) -> list[str]:
    """Checks 2 and 3: the soak's answer against the same body sent alone, unstreamed."""
    problems = []
    for i in range(job.n):
        got, want = soak.texts.get(i, ""), alone.texts.get(i)
        if soak.abandoned:  # hung up: what came must be the start of the answer
            if want is None or not want.startswith(got):
                problems.append(f"choice {i}: streamed {got!r} before hanging up, which does not begin {want!r}")
        elif (got, soak.finish.get(i)) != (want, alone.finish.get(i)):
            problems.append(f"choice {i}: {got!r} ({soak.finish.get(i)}) under load, "
                            f"{want!r} ({alone.finish.get(i)}) alone")
    if soak.abandoned or not alone.usage:
        return problems
    tokens = soak.usage["completion_tokens"] if soak.usage else sum(soak.chunks.values())
    if tokens != alone.usage["completion_tokens"]:
        problems.append(f"{tokens} completion tokens under load, {alone.usage['completion_tokens']} alone")
    if soak.usage and soak.usage["prompt_tokens"] != alone.usage["prompt_tokens"]:
        problems.append(f"{soak.usage['prompt_tokens']} prompt tokens under load, "
                        f"{alone.usage['prompt_tokens']} alone")
    return problems
