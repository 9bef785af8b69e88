"""Closing within the budget, counted in tokens: is an answer that fits max_new_tokens ever changed?

    python -m course.s08_structured.realworld.bench_closing [--prompts 50] [--results]
    python -m course.s08_structured.realworld.bench_closing --quick      # tiny model (tests)

Two schemas of the kind agents and `with_structured_output` send, required strings in both:
a weather tool's arguments (`city`, `unit` optional) and a contact (`name`, `email`), asked
about `--prompts` cities and people each. Per prompt, the model answers greedily with no
budget pressure: its own answer, n tokens with the stop token. Then again with closing on
(`CloseOnBudget`) at max_new_tokens = n and n + 4 (it fits: it must come back token for token,
finish_reason "stop") and n - 1 (it does not: it must end "length"). Budget n is also run with
closing counted in bytes (a byte per token, the pessimistic count), side by side. The report
counts fitting answers changed, how many of those had a required string emptied, and cut
answers that did not say "length".
"""
from __future__ import annotations

import argparse
import json

import torch

from course.s01_decode_loop.bench.measure import bench_cli

CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Hanoi", "Denver", "Porto", "Quito", "Dakar",
          "Perth", "Seoul", "Dublin", "Nairobi", "Bogota", "Kyiv", "Accra", "Zurich", "Manila", "Havana",
          "Reykjavik", "Montreal", "Marrakesh", "Istanbul", "Mumbai", "Santiago", "Helsinki", "Osaka", "Tunis",
          "Vienna", "Prague", "Chicago", "Seattle", "Auckland", "Bangkok", "Jakarta", "Munich", "Lisbon",
          "Athens", "Warsaw", "Budapest", "Toronto", "Karachi", "Kampala", "Medellin", "Valencia", "Boston",
          "Phoenix", "Glasgow"]
PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Ken Thompson", "Barbara Liskov", "Donald Knuth",
          "Edsger Dijkstra", "Frances Allen", "John Backus", "Margaret Hamilton", "Dennis Ritchie", "Radia Perlman",
          "Tim Berners-Lee", "Shafi Goldwasser", "Leslie Lamport", "Niklaus Wirth", "Hedy Lamarr", "Claude Shannon",
          "Katherine Johnson", "Linus Torvalds", "Guido van Rossum", "Bjarne Stroustrup", "Adele Goldberg",
          "Vint Cerf", "Sophie Wilson", "Tony Hoare", "Robin Milner", "Fran Allen", "Jean Sammet", "Anita Borg",
          "Ivan Sutherland", "Butler Lampson", "Andrew Yao", "Judea Pearl", "Yann LeCun", "Fei-Fei Li",
          "Geoffrey Hinton", "Yoshua Bengio", "Cynthia Dwork", "Silvio Micali", "Whitfield Diffie",
          "Martin Hellman", "Ron Rivest", "Adi Shamir", "Leonard Adleman", "Jeff Dean", "Sanjay Ghemawat",
          "Rob Pike", "Brian Kernighan", "Alfred Aho"]
SCHEMAS = {
    "weather": ({"type": "object", "properties": {"city": {"type": "string"},
                                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                 "required": ["city"], "additionalProperties": False},
                "Call get_weather for {x}: reply with its arguments as JSON only.", CITIES, ["city"]),
    "contact": ({"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                 "required": ["name", "email"], "additionalProperties": False},
                "Give {x}'s contact card as JSON with a name and an email address.", PEOPLE, ["name", "email"]),
}


def emptied(text: str, natural: str, fields: list[str]) -> bool:
    """A required string the model's own answer filled came back empty (or missing)."""
    try:
        got, want = json.loads(text), json.loads(natural)
    except ValueError:
        return False
    return any(want.get(f) and not got.get(f) for f in fields)


@torch.no_grad()
def run(args: argparse.Namespace) -> dict:
    from course.s01_decode_loop.generate import encode_prompt, run_to_end
    from course.s01_decode_loop.sampling import SamplingParams

    from ..generate import ConstrainedGenerator
    from ..json_schema import SERVING_BOUNDS, json_schema_to_grammar
    from ..matcher import compile_grammar
    from ..serving.closing import CloseOnBudget
    from ..vocab import TokenizerInfo

    if args.quick:
        from pathlib import Path

        from course.s01_decode_loop.testing import byte_tokenizer, tiny_model
        from course.s01_decode_loop.weights import LoadedModel
        loaded, chat = LoadedModel(tiny_model("gqa_tied", seed=0), byte_tokenizer(), Path(".")), False
    else:
        from course.s01_decode_loop.weights import load_model
        loaded, chat = load_model(), True
    tok = loaded.tokenizer
    info = TokenizerInfo.from_huggingface(tok, loaded.config.vocab_size, stop_ids=loaded.eos_token_ids)
    closers = {unit: CloseOnBudget(unit=unit) for unit in ("tokens", "bytes")}

    def answer(compiled, ids, budget, unit=None):
        gen = ConstrainedGenerator(compiled, narrow=closers[unit] if unit else None)
        return run_to_end(gen, loaded.model, tok, ids, SamplingParams(max_new_tokens=budget, temperature=0.0),
                          loaded.eos_token_ids)

    cases = []
    for name, (schema, ask, subjects, fields) in SCHEMAS.items():
        compiled = compile_grammar(json_schema_to_grammar(schema, mode="best-effort", default_bounds=SERVING_BOUNDS),
                                   info, precompute=False)
        for x in subjects[:args.prompts]:
            ids = encode_prompt(tok, ask.format(x=x), chat=chat)
            natural = answer(compiled, ids, args.max_new_tokens)
            if natural.finish_reason != "stop":  # never finished on its own: no budget fits it
                continue
            n = len(natural.token_ids)
            for budget, units in ((n, closers), (n + 4, ["tokens"]), (n - 1, ["tokens"])):
                for unit in units:
                    out = answer(compiled, ids, budget, unit)
                    cases.append({"schema": name, "subject": x, "natural_tokens": n, "budget": budget, "unit": unit,
                                  "fits": budget >= n, "same": out.token_ids == natural.token_ids,
                                  "finish_reason": out.finish_reason,
                                  "emptied": emptied(out.text, natural.text, fields), "text": out.text})
    return {"prompts_per_schema": args.prompts, "summary": {unit: summarize(cases, unit) for unit in closers},
            "cases": cases}


def summarize(cases: list[dict], unit: str) -> dict:
    mine = [c for c in cases if c["unit"] == unit]
    fit, cut = [c for c in mine if c["fits"]], [c for c in mine if not c["fits"]]
    return {"fitting_cases": len(fit), "fitting_changed": sum(not c["same"] or c["finish_reason"] != "stop" for c in fit),
            "fitting_emptied": sum(c["emptied"] for c in fit), "cut_cases": len(cut),
            "cut_not_length": sum(c["finish_reason"] != "length" for c in cut)}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=50, help="subjects per schema")
    p.add_argument("--max-new-tokens", type=int, default=96, help="the budget of the model's own answer")
    p.add_argument("--quick", action="store_true", help="a tiny random model and byte tokenizer (tests)")


def report(result: dict) -> None:
    for unit, s in result["summary"].items():
        print(f"closing counted in {unit:>6}: {s['fitting_changed']}/{s['fitting_cases']} fitting answers changed "
              f"({s['fitting_emptied']} with a required string emptied), {s['cut_not_length']}/{s['cut_cases']} "
              f"cut answers not ending \"length\"")


main = bench_cli(__doc__, add_args, run, report, module="course.s08_structured.realworld.bench_closing")

if __name__ == "__main__":
    main()
