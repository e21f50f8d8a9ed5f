"""``--hf PATH``: a Hugging Face causal language model on the command line. ``PATH`` is a model folder
or a ``.gguf`` file, loaded offline with ``transformers`` (the ``hf`` extra) in float32; its own
tokenizer turns text into batches: ``--text FILE`` (one paragraph per line), else qinsight's own
English paragraphs (``qinsight.examples.smollm.TEXTS``; a plan scores on ``HELD_OUT_TEXTS``)."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any

from qinsight.core.errors import MissingExtraError, UsageError

INSTALL = "pip install 'qinsight[hf]'"


def load(path: str, *, quiet: bool = False) -> tuple[Any, Any]:
    """The model (eval mode) and its tokenizer from a folder or a GGUF file, offline (``quiet``: without
    transformers' progress bars); a missing path or extra is one error naming what to change."""
    try:
        import transformers
    except ModuleNotFoundError as exc:
        raise MissingExtraError(f"--hf needs Hugging Face transformers: {INSTALL}") from exc
    import torch

    where = Path(path)
    if not where.exists():
        raise UsageError(f"--hf {path}: no such folder or .gguf file")
    gguf = {"gguf_file": where.name} if where.suffix == ".gguf" else {}
    folder = str(where.parent if gguf else where)
    # quiet: the progress bars transformers draws (its GGUF conversion's through tqdm directly) kept off stderr
    muted = contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext()
    try:
        with muted:
            model: Any = transformers.AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32, local_files_only=True, **gguf
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, **gguf)
    except (OSError, ValueError) as exc:  # not a model transformers knows, or files missing
        raise UsageError(f"--hf {path}: transformers cannot load a causal language model from it: {exc}") from exc
    return model.eval(), tokenizer


def texts(file: str | None, default: tuple[str, ...]) -> list[str]:
    """The paragraphs of ``file`` (its non-empty lines), else ``default``."""
    if file is None:
        return list(default)
    try:
        found = [line.strip() for line in Path(file).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--text {file}: cannot read it: {exc}") from exc
    if not found:
        raise UsageError(f"--text {file}: no text in it (one paragraph per line)")
    return found


def batches(tokenizer: Any, paragraphs: list[str], tokens: int) -> list[Any]:
    """One (1, at most ``tokens``) batch of token ids per paragraph."""
    if tokens < 2:
        raise UsageError("--tokens must be at least 2 (a next token to predict)")
    return [tokenizer(text, return_tensors="pt").input_ids[:, :tokens] for text in paragraphs]


def calibration(args: argparse.Namespace, tokenizer: Any) -> list[Any]:
    """The calibration batches ``--text``/``--tokens``/``--batches`` ask for."""
    from qinsight.examples.smollm import TEXTS

    return batches(tokenizer, texts(args.text, TEXTS), args.tokens)[: args.batches]


def evaluation(args: argparse.Namespace, tokenizer: Any) -> list[Any]:
    """The batches a plan is scored on: ``--eval-text``, else qinsight's held-out paragraphs."""
    from qinsight.examples.smollm import HELD_OUT_TEXTS

    return batches(tokenizer, texts(args.eval_text, HELD_OUT_TEXTS), args.tokens)[: args.eval_batches]


__all__ = ["INSTALL", "batches", "calibration", "evaluation", "load", "texts"]
