"""Report file sizes and load times: every number a JSON number, typed arrays (schema 3: repeats referenced,
byte planes deflated), gzip and xz.

The Llama-shaped stack (qinsight.examples.stack: width 512, MLP 1408, 4 layers, 1x256 tokens,
4 batches, the default detectors), diagnosed once, written in each form and read back (best of 3).
``--width 4096`` gives the 7B-width stack (MLP 11008, 2048 tokens: a few GB of memory). Run by hand:
    python tests/benchmarks/bench_files.py [--width 4096 [--device cuda]]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

import qinsight
from qinsight.examples.stack import llama_stack, stack_batches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--device", default="cpu", help="where the stack runs (cuda: the 7B width in seconds)")
    parser.add_argument(
        "--tokens",
        type=int,
        help="tokens per batch (default 256; 2048 at the 7B width): the file's size does not depend on it",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    wide = args.width >= 4096
    mlp, tokens, heads = (11008, 2048, 32) if wide else (args.width * 11 // 4, 256, 8)
    tokens = args.tokens or tokens
    model = llama_stack(width=args.width, mlp=mlp, layers=4, heads=heads).to(args.device)
    batches = [batch.to(args.device) for batch in stack_batches(width=args.width, tokens=tokens, count=4)]
    start = time.perf_counter()
    # verify=False: verification quantizes copies of the model, more than a 24 GB machine holds at the 7B
    # width; it adds a few KB to a file
    report = qinsight.diagnose(model, batches, verify=False)
    print(f"diagnosed in {time.perf_counter() - start:.1f} s on {args.device}")
    folder = tempfile.mkdtemp()
    print(f"Llama-shaped stack, width {args.width}, MLP {mlp}, 4 layers, {tokens} tokens")
    plain = 0
    for name, keywords in (
        ("plain.json", {"packed": False}),
        ("report.json", {}),
        ("report.json.gz", {}),
        ("report.json.xz", {}),
    ):
        path = os.path.join(folder, name)
        qinsight.save_report(report, path, **keywords)
        size = os.path.getsize(path)
        plain = plain or size
        loads = []
        for _ in range(3):
            start = time.perf_counter()
            assert qinsight.load_report(path) == report
            loads.append(time.perf_counter() - start)
        print(f"  {name:<15} {size / 1e6:7.2f} MB ({plain / size:4.1f}x smaller), loads in {min(loads):.3f} s")


if __name__ == "__main__":
    main()
