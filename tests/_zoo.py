"""The zoo sweep: architectures built from code with random weights (no download), each through what a
user runs first: ``diagnose`` (in the frontend it takes), ``compare_configs`` (x86 against XNNPACK) and
the report's verification, at a small input size. A step ends in its result or in one
:class:`~qinsight.errors.QinsightError` line naming what qinsight does not support yet; anything else is a
bug the sweep found. Run by tests/models/test_zoo.py (the extended tier) and tests/benchmarks/zoo_table.py
(the table of docs/zoo.md)."""

from __future__ import annotations

import copy
import importlib.util
import json
import signal
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

import qinsight
from qinsight.errors import QinsightError

# Where the sweep finds torchvision: a folder of its own, never the environment's site-packages. PyPI's
# torchvision 0.28 is a CUDA build whose C operators cannot load beside the CPU torch, and a torchvision
# that fails to import makes every `transformers` model fail to import too.
TORCHVISION = Path(__file__).resolve().parent.parent / ".zoo"
INSTALL = "pip install --no-deps --target .zoo torchvision==0.28.0"


def torchvision_models() -> Any:
    """``torchvision.models`` from :data:`TORCHVISION`, its package imported without its ``__init__`` (the
    classification models need none of the C operators); ``None`` where it is not there (:data:`INSTALL`)."""
    if "torchvision.models" in sys.modules:
        return sys.modules["torchvision.models"]
    folder = TORCHVISION / "torchvision"
    if not folder.is_dir():
        return None
    package = types.ModuleType("torchvision")
    package.__path__ = [str(folder)]
    sys.modules["torchvision"] = package
    import torchvision.models

    return torchvision.models


# torchvision 0.28's classification models (``list_models(module=torchvision.models)``), named here so that
# collecting the tests imports no torchvision.
TORCHVISION_NAMES = (
    "alexnet",
    "convnext_base",
    "convnext_large",
    "convnext_small",
    "convnext_tiny",
    "densenet121",
    "densenet161",
    "densenet169",
    "densenet201",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_v2_l",
    "efficientnet_v2_m",
    "efficientnet_v2_s",
    "googlenet",
    "inception_v3",
    "maxvit_t",
    "mnasnet0_5",
    "mnasnet0_75",
    "mnasnet1_0",
    "mnasnet1_3",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "regnet_x_16gf",
    "regnet_x_1_6gf",
    "regnet_x_32gf",
    "regnet_x_3_2gf",
    "regnet_x_400mf",
    "regnet_x_800mf",
    "regnet_x_8gf",
    "regnet_y_128gf",
    "regnet_y_16gf",
    "regnet_y_1_6gf",
    "regnet_y_32gf",
    "regnet_y_3_2gf",
    "regnet_y_400mf",
    "regnet_y_800mf",
    "regnet_y_8gf",
    "resnet101",
    "resnet152",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5",
    "shufflenet_v2_x2_0",
    "squeezenet1_0",
    "squeezenet1_1",
    "swin_b",
    "swin_s",
    "swin_t",
    "swin_v2_b",
    "swin_v2_s",
    "swin_v2_t",
    "vgg11",
    "vgg11_bn",
    "vgg13",
    "vgg13_bn",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "vit_b_16",
    "vit_b_32",
    "vit_h_14",
    "vit_l_16",
    "vit_l_32",
    "wide_resnet101_2",
    "wide_resnet50_2",
)


# Architectures whose smallest input is larger than the sweep's 64x64, or whose size is fixed when built.
_SIDE = {"inception_v3": 96, "maxvit_t": 224, "vit_h_14": 56}  # maxvit: each stage's size divisible by its 7x7 windows
_BUILD = {name: {"image_size": 64} for name in ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32")} | {
    "vit_h_14": {"image_size": 56},
}


def torchvision_names() -> list[str]:
    """:data:`TORCHVISION_NAMES` where the sweep's torchvision is there (none imported), else none."""
    return list(TORCHVISION_NAMES) if (TORCHVISION / "torchvision").is_dir() else []


def torchvision_case(name: str) -> tuple[Callable[[], nn.Module], list[torch.Tensor]]:
    models = torchvision_models()
    side = _SIDE.get(name, 64)
    generator = torch.Generator().manual_seed(0)
    data = [torch.randn(2, 3, side, side, generator=generator) for _ in range(4)]

    def build() -> nn.Module:
        torch.manual_seed(0)
        extra: dict[str, Any] = (
            {"aux_logits": False, "init_weights": False} if name in ("inception_v3", "googlenet") else {}
        )
        return models.get_model(name, weights=None, **_BUILD.get(name, {}), **extra).eval()

    return build, data


@attrs.frozen
class Outcome:
    """One step's result: ``ok``, or the error it ended in (its first line, and how many lines it had);
    ``raw`` where that was no QinsightError."""

    ok: bool
    said: str
    raw: bool = False
    seconds: float = 0.0
    lines: int = 1


@attrs.frozen
class Row:
    name: str
    parameters: int
    frontend: str
    diagnose: Outcome
    compare: Outcome
    verify: Outcome


def _step(run: Callable[[], str]) -> Outcome:
    start = time.perf_counter()
    try:
        said = run()
    except Exception as exc:  # a QinsightError is a supported ending; anything else, the sweep's finding
        said = f"{type(exc).__name__}: {exc}".splitlines() or [type(exc).__name__]
        raw = not isinstance(exc, QinsightError)
        return Outcome(False, said[0][:400], raw=raw, seconds=time.perf_counter() - start, lines=len(said))
    return Outcome(True, said, seconds=time.perf_counter() - start)


def sweep(name: str, build: Callable[[], nn.Module], data: list[Any], *, xnnpack: bool = True) -> Row:
    """``name`` through diagnose (no verification), compare_configs (x86 against XNNPACK) and verify_report."""
    from qinsight.backends.x86 import default_x86_quantizer
    from qinsight.backends.xnnpack import default_xnnpack_quantizer

    model = build()
    parameters = sum(p.numel() for p in model.parameters())
    found: dict[str, Any] = {}

    def diagnose() -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = qinsight.diagnose(model, data[:2], verify=False)
        found["report"] = report
        return f"{len([s for s in report.sites if s.kind.is_layer])} layers, {len(report.suggestions)} suggestions"

    def compare() -> str:
        configs = {"x86": default_x86_quantizer()}
        if xnnpack:
            configs["xnnpack"] = default_xnnpack_quantizer()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # keyword batches (a Hugging Face model's): export takes them as positional example inputs
            example = tuple(data[0].values()) if isinstance(data[0], dict) else None
            comparison = qinsight.compare_configs(
                copy.deepcopy(model), configs, data[:2], data[2:3], example_inputs=example
            )
        return f"{len(comparison.rows)} rows"

    def verify() -> str:
        report = found.get("report")
        if report is None:
            raise RuntimeError("no report to verify")  # noqa: TRY003  never raised once diagnose passed
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            verified = qinsight.verify_report(model, report, data)
        return "; ".join(
            f"{v.flow} {v.default:.1f} -> {v.score:.1f} dB" if v.verified else f"{v.flow}: {v.error}"
            for v in verified.verification
        )

    diagnosed = _step(diagnose)
    return Row(
        name=name,
        parameters=parameters,
        frontend=found["report"].metadata.frontend if "report" in found else "",
        diagnose=diagnosed,
        compare=_step(compare),
        verify=_step(verify) if diagnosed.ok else Outcome(False, "not diagnosed"),
    )


# Hugging Face architectures built from small configs: an encoder, a decoder, an encoder-decoder, a vision
# transformer and a speech encoder (random weights, no download).
def _hf_models() -> dict[str, Callable[[], tuple[nn.Module, list[Any]]]]:
    def tokens(vocab: int, decoder: bool = False) -> list[Any]:
        generator = torch.Generator().manual_seed(0)
        batches = []
        for _ in range(4):
            ids = torch.randint(0, vocab, (2, 16), generator=generator)
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            if decoder:
                batch["decoder_input_ids"] = torch.randint(0, vocab, (2, 8), generator=generator)
            batches.append(batch)
        return batches

    def images() -> list[Any]:
        generator = torch.Generator().manual_seed(0)
        return [{"pixel_values": torch.randn(2, 3, 64, 64, generator=generator)} for _ in range(4)]

    def audio() -> list[Any]:
        generator = torch.Generator().manual_seed(0)
        return [{"input_values": torch.randn(2, 4000, generator=generator)} for _ in range(4)]

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}

    def bert() -> tuple[nn.Module, list[Any]]:
        import transformers

        config = transformers.BertConfig(vocab_size=1000, **small)
        return transformers.BertForSequenceClassification(config), tokens(1000)

    def llama() -> tuple[nn.Module, list[Any]]:
        import transformers

        config = transformers.LlamaConfig(vocab_size=1000, num_key_value_heads=2, **small)
        return transformers.LlamaForCausalLM(config), tokens(1000)

    def t5() -> tuple[nn.Module, list[Any]]:
        import transformers

        config = transformers.T5Config(
            vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4
        )
        return transformers.T5ForConditionalGeneration(config), tokens(1000, decoder=True)

    def vit() -> tuple[nn.Module, list[Any]]:
        import transformers

        config = transformers.ViTConfig(image_size=64, patch_size=16, num_labels=10, **small)
        return transformers.ViTForImageClassification(config), images()

    def wav2vec2() -> tuple[nn.Module, list[Any]]:
        import transformers

        config = transformers.Wav2Vec2Config(
            conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, **small
        )
        return transformers.Wav2Vec2Model(config), audio()

    return {"hf-bert": bert, "hf-llama": llama, "hf-t5": t5, "hf-vit": vit, "hf-wav2vec2": wav2vec2}


HF_NAMES = tuple(_hf_models())


def names() -> list[str]:
    """Every architecture of the sweep: torchvision's classification models, then the Hugging Face ones."""
    hf = list(HF_NAMES) if importlib.util.find_spec("transformers") is not None else []
    return torchvision_names() + hf


def case(name: str) -> tuple[Callable[[], nn.Module], list[Any]]:
    """How to build architecture ``name`` (seeded, eval mode) and the batches it runs on."""
    if name not in HF_NAMES:
        return torchvision_case(name)
    made = _hf_models()[name]

    def build() -> nn.Module:
        torch.manual_seed(0)
        return made()[0].eval()

    return build, made()[1]


_ONE = """
import json, sys, attrs, torch
sys.path.insert(0, {tests!r})
threads = {threads!r}
if threads is not None:
    torch.set_num_threads(threads)
import _zoo
build, data = _zoo.case({name!r})
print("ROW " + json.dumps(attrs.asdict(_zoo.sweep({name!r}, build, data))), flush=True)
"""


def isolated(name: str, timeout: float, threads: int | None = None) -> dict[str, Any]:
    """:func:`sweep` of ``name`` in a process of its own (the sweep's torchvision stays out of the caller,
    and a crash or a hang is a result too), on ``threads`` threads: the row as a dict, or ``{"name", "failed"}``."""
    code = _ONE.format(tests=str(Path(__file__).parent), name=name, threads=threads)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "failed": f"did not finish in {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("ROW "):
            row: dict[str, Any] = json.loads(line[4:])
            return row
    if done.returncode == -signal.SIGKILL:  # the kernel's out-of-memory killer: stderr holds only chatter
        return {"name": name, "failed": "the process was killed (SIGKILL): out of memory on this machine"}
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"name": name, "failed": f"the process ended ({done.returncode}): {tail[:200]}"}
