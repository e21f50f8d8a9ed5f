"""Per-site sensitivity: qinsight's simulation against brute force, in one process.

Brute force is what one does by hand: for every layer, prepare the model with
that layer kept in float, calibrate, convert, evaluate (one real quantization
per site, plus the default config). The simulation calibrates one prepared
graph once and switches each site's fake quantization off in turn, recomputing
only what the site reaches from a cached all-quantized run.

Prints, for the layers (Linear/Conv) of the model: the simulated cost in
whole evaluation forwards against the bound 1.5 x (sites + 1), the wall times
and their ratio, and how the two rankings of "gain in float" agree (Spearman).

    python tests/benchmarks/bench_plan.py --model mobilenet_v2 --flow pt2e
    python tests/benchmarks/bench_plan.py --model minilm --flow fx

Run it on an idle machine: brute force takes minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import qinsight  # noqa: E402
from qinsight.apply.trial import model_outputs  # noqa: E402
from qinsight.core.suggestions import QuantSuggestion  # noqa: E402
from qinsight.planning.planner import spearman  # noqa: E402
from qinsight.planning.scores import Scorer  # noqa: E402
from qinsight.planning.simulated_flows import flow_for  # noqa: E402
from qinsight.planning.sweep import sweep  # noqa: E402
from qinsight.planning.switches import Mode  # noqa: E402


def _model_and_data(name: str, calibration: int, evaluation: int) -> tuple[torch.nn.Module, list[Any], list[Any], str]:
    from _data import photo_crops, sentence_batches
    from _real import minilm_or_skip, mobilenet_v2_or_skip

    if name == "mobilenet_v2":
        return mobilenet_v2_or_skip(), photo_crops(calibration, seed=1), photo_crops(evaluation, seed=2), "sqnr"
    if name == "minilm":
        sentences = sentence_batches(8)
        return minilm_or_skip(), sentences[:calibration], sentences[calibration : calibration + evaluation], "sqnr"
    raise SystemExit(f"--model: mobilenet_v2 or minilm, not {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--flow", default="pt2e", choices=("fx", "pt2e"))
    parser.add_argument("--calibration", type=int, default=16, help="crops (MobileNetV2) or sentence batches (MiniLM)")
    parser.add_argument("--evaluation", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    model, calibration, evaluation, metric = _model_and_data(args.model, args.calibration, args.evaluation)
    report = qinsight.diagnose(model, calibration)
    flow = flow_for(
        args.flow, model, report.sites, "x86", calibration + evaluation, report.fx_activations
    )  # as a plan observes
    scorer = Scorer(model_outputs(model, evaluation), metric, metric)
    layers = [site.fqn for site in report.sites if site.kind.is_layer]

    began = time.perf_counter()
    sim = flow.simulation(calibration)
    sites = [site for site in sim.sites if site in set(layers)]
    start = {site: Mode.STATIC for site in sim.sites}
    base, floated = sweep(sim, start, [{**start, site: Mode.FLOAT} for site in sites], evaluation, scorer)
    simulated = [score - base for score in floated]
    sim_seconds, sim_forwards = time.perf_counter() - began, sim.evaluations

    began = time.perf_counter()
    default = scorer(list(flow.trial((), calibration, evaluation).outputs))
    real = []
    for done, site in enumerate(sites):
        keep = (QuantSuggestion(fqn=site, keep_float=True, sources=("bench",)),)
        real.append(scorer(list(flow.trial(keep, calibration, evaluation).outputs)) - default)
        print(f"\rbrute force {done + 1}/{len(sites)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    brute_seconds = time.perf_counter() - began

    print(f"{args.model}, {args.flow}, {len(sites)} layers, {metric} on {len(scorer.rows)} held-out samples")
    print(f"default config: {default:.3f} for real, {base:.3f} simulated")
    print(
        f"simulated: {sim_seconds:.1f} s, {sim_forwards:.1f} evaluation forwards (bound 1.5 x (sites + 1) = "
        f"{1.5 * (len(sites) + 1):.1f})"
    )
    print(f"brute force: {brute_seconds:.1f} s ({len(sites) + 1} real quantizations)")
    print(f"brute force / simulated: {brute_seconds / sim_seconds:.1f}x")
    print(f"Spearman, gain in float (simulated vs real): {spearman(simulated, real):.3f}")
    rows = list(zip(sites, simulated, real))
    print("largest real gains:")
    for site, s, r in sorted(rows, key=lambda row: -row[2])[:8]:
        print(f"  {site:40s} simulated {s:+7.3f}  real {r:+7.3f}")
    print("largest disagreements:")
    for site, s, r in sorted(rows, key=lambda row: -abs(row[1] - row[2]))[:5]:
        print(f"  {site:40s} simulated {s:+7.3f}  real {r:+7.3f}")


if __name__ == "__main__":
    main()
