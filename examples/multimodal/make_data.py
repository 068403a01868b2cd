"""Write the multimodal example's data next to its recipe (no network).

Usage: ``python examples/multimodal/make_data.py [--out DIR]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zephon_nodes.multimodal.corpus import write_jsonl, write_tar_shards


def make(out: Path) -> None:
    """Write 8 tar shards of 32 samples and a jsonl file of 128 records under ``out``."""
    tars = write_tar_shards(out / "photos", shards=8, per_shard=32, seed=1)
    jsonl = write_jsonl(out / "captions.jsonl", records=128, seed=2)
    size = sum(p.stat().st_size for p in [*tars, jsonl])
    print(f"wrote {len(tars)} tar shards and {jsonl.name} under {out} ({size / 1e6:.1f} MB)")


def main() -> None:
    """Parse the arguments and write the data."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    make(ap.parse_args().out)


if __name__ == "__main__":
    main()
