"""How the files beside this one were made: a fixed sample of JSONSchemaBench's collections.

JSONSchemaBench (Geng et al., 2025; github.com/guidance-ai/jsonschemabench, data/) gathers ~10,000
real-world schemas in collections of rising difficulty. Six of them are sampled here, twelve
schemas each (seeded, files under 64 KB so the repo stays small), one JSON file per collection:
{schema file name: schema}. `bench_coverage.py` and `bench_invalid.py` read them.

    python -m course.s08_structured.realworld.jsonschemabench.sample PATH/TO/jsonschemabench
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

COLLECTIONS = ("Glaiveai2K", "Github_medium", "Github_hard", "Kubernetes", "Snowplow", "JsonSchemaStore")
PER_COLLECTION, MAX_BYTES, SEED = 12, 64 * 1024, 0
HERE = Path(__file__).parent


def load() -> dict[str, dict]:
    """Every sampled schema, named "COLLECTION/FILE"."""
    out = {}
    for collection in COLLECTIONS:
        for name, schema in json.loads((HERE / f"{collection}.json").read_text()).items():
            out[f"{collection}/{name}"] = schema
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkout", type=Path, help="a checkout of guidance-ai/jsonschemabench")
    args = p.parse_args(argv)
    for collection in COLLECTIONS:
        files = sorted(f for f in (args.checkout / "data" / collection).glob("*.json") if f.stat().st_size <= MAX_BYTES)
        chosen = sorted(random.Random(f"{SEED}/{collection}").sample(files, PER_COLLECTION))
        sample = {f.stem: json.loads(f.read_text()) for f in chosen}
        (HERE / f"{collection}.json").write_text(json.dumps(sample, indent=1, sort_keys=True) + "\n")
        print(f"{collection}: {len(sample)} schemas")


if __name__ == "__main__":
    main()
