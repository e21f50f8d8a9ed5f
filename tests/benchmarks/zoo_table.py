"""The zoo sweep's table (docs/zoo.md): every torchvision classification architecture and a few Hugging Face
ones, random weights, through diagnose, compare_configs (x86 against XNNPACK) and verification.

Each architecture runs in a process of its own (a crash or a hang is a row too), one at a time:

    python tests/benchmarks/zoo_table.py [--timeout 900] [--jobs 2] [--out zoo.jsonl] [NAME ...]

It prints the markdown table; ``--out`` keeps the rows (one JSON object each), and a rerun skips the
architectures already there.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _zoo  # noqa: E402


def _cell(outcome: dict[str, object]) -> str:
    said = str(outcome["said"]).replace("|", "/")
    if outcome["ok"]:
        return f"ok: {said}"
    return f"**raw** {said}" if outcome["raw"] else said


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| architecture | parameters | frontend | diagnose | compare_configs (x86, XNNPACK) | verification |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "failed" in row:
            lines.append(f"| {row['name']} | | | **{row['failed']}** | | |")
            continue
        steps = [_cell(row[step]) for step in ("diagnose", "compare", "verify")]  # type: ignore[arg-type]
        lines.append(
            f"| {row['name']} | {int(row['parameters']) / 1e6:.1f}M | {row['frontend']} | " + " | ".join(steps) + " |"
        )  # type: ignore[call-overload]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--jobs", type=int, default=1, help="architectures at once, each on one thread")
    arguments = parser.parse_args()
    known: dict[str, dict[str, object]] = {}
    if arguments.out is not None and arguments.out.exists():
        for line in arguments.out.read_text().splitlines():
            row = json.loads(line)
            known[str(row["name"])] = row
    pending = [name for name in arguments.names or _zoo.names() if name not in known]
    threads = 1 if arguments.jobs > 1 else None
    with concurrent.futures.ThreadPoolExecutor(arguments.jobs) as pool:
        for row in pool.map(lambda name: _zoo.isolated(name, arguments.timeout, threads), pending):
            known[str(row["name"])] = row
            print(json.dumps(row), file=sys.stderr, flush=True)
            if arguments.out is not None:
                with arguments.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")
    print(table([known[name] for name in arguments.names or _zoo.names() if name in known]))


if __name__ == "__main__":
    main()
