"""Random-weight models that carry a real model family's tokenizer and chat template.

The pinned llama.cpp ships vocabulary-only GGUFs (`models/ggml-vocab-*.gguf`) and the chat
templates of the families llama-server supports (`models/templates/*.jinja`) in its source, which
scripts/setup.sh already keeps (the llama-cpp-python release archive). This writes a one-layer
Llama-architecture model with random weights, one of those tokenizers and one of those templates:
it knows nothing, but it tokenizes, renders and is constrained exactly as the family does, so a
GBNF grammar can force the family's exact output through the real engine and server.

    python -m bench.family_model --family qwen3 --out var/models/qwen3-family.gguf
    python -m bench.family_model --list
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gguf import GGUFReader

from harness.models.synth_model import ModelShape, write_model

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Family:
    vocab: str  # models/ggml-vocab-<vocab>.gguf
    template: str  # models/templates/<template>.jinja


# The tokenizer each family's models use, where the pinned llama.cpp ships it (else a close one:
# the template's markup is then several ordinary tokens, which parses the same).
FAMILIES: dict[str, Family] = {
    "qwen3": Family("qwen2", "Qwen-Qwen3-0.6B"),
    "qwen3.5": Family("qwen35", "Qwen3.5-4B"),
    "qwq": Family("qwen2", "Qwen-QwQ-32B"),
    "qwen2.5": Family("qwen2", "Qwen-Qwen2.5-7B-Instruct"),
    "deepseek-r1": Family("deepseek-llm", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"),
    "gpt-oss": Family("qwen2", "openai-gpt-oss-120b"),
    "llama3.1": Family("llama-bpe", "meta-llama-Llama-3.1-8B-Instruct"),
    "llama3.2": Family("llama-bpe", "meta-llama-Llama-3.2-3B-Instruct"),
    "mistral-nemo": Family("llama-spm", "mistralai-Mistral-Nemo-Instruct-2407"),
    "devstral": Family("llama-spm", "unsloth-mistral-Devstral-Small-2507"),
    "gemma4": Family("gemma-4", "google-gemma-4-31B-it"),
    "glm4.6": Family("qwen2", "GLM-4.6"),
    "kimi-k2": Family("qwen2", "moonshotai-Kimi-K2"),
    "granite3.3": Family("llama-bpe", "ibm-granite-granite-3.3-2B-Instruct"),
    "hermes3": Family("llama-bpe", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use"),
    "functionary3.2": Family("llama-bpe", "meetkai-functionary-medium-v3.2"),
    "command-r7b": Family("command-r", "CohereForAI-c4ai-command-r7b-12-2024-tool_use"),
}


@cache
def source_archive() -> Path:
    """The pinned llama-cpp-python release archive (fetched once by scripts/llama-cpp-source.sh)."""
    out = subprocess.run([str(ROOT / "scripts" / "llama-cpp-source.sh"), "--fetch"], check=True,
                         capture_output=True, text=True).stdout.strip()
    return Path(out)


def models_dir() -> Path:
    """The pinned llama.cpp's `models/` templates and vocabulary GGUFs, unpacked once (one pass
    over the release archive) into ~/.cache/arbor/llama-models/<release>/ (ARBOR_MODELS_CACHE)."""
    archive = source_archive()
    root = Path(os.environ.get("ARBOR_MODELS_CACHE", Path.home() / ".cache" / "arbor" / "llama-models"))
    out = root / archive.name.removesuffix(".tar.gz")
    if (out / ".complete").exists():
        return out
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root if root.exists() else _made(root)))
    with tarfile.open(archive) as tar:
        for member in tar:
            rel = member.name.partition("/vendor/llama.cpp/models/")[2]
            wanted = rel.startswith("templates/") and rel.endswith(".jinja") or (
                rel.startswith("ggml-vocab-") and rel.endswith(".gguf"))
            if member.isfile() and wanted:
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                dest.write_bytes(src.read())
    (tmp / ".complete").touch()
    try:
        tmp.rename(out)
    except OSError:  # another process unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def template_text(name: str) -> str:
    """models/templates/<name>.jinja of the pinned llama.cpp."""
    return (models_dir() / "templates" / f"{name}.jinja").read_text()


def vocab_file(name: str) -> Path:
    """models/ggml-vocab-<name>.gguf of the pinned llama.cpp."""
    return models_dir() / f"ggml-vocab-{name}.gguf"


def write_family_model(family: str, out: Path, *, seed: int = 0) -> Path:
    """A one-layer random-weight model with `family`'s tokenizer and template, at `out`."""
    spec = FAMILIES[family]
    vocab = vocab_file(spec.vocab)
    n_tokens = len(GGUFReader(vocab).fields["tokenizer.ggml.tokens"].data)
    shape = ModelShape("llama", n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, head_dim=16,
                       vocab=n_tokens, tokenizer_vocab=n_tokens, context_length=4096)
    return write_model(shape, "q8_0", out, seed=seed, name=family, tokenizer_source=vocab,
                       chat_template=template_text(spec.template))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--list", action="store_true", help="list the families and what they carry")
    args = parser.parse_args(argv)
    if args.list or not args.family:
        for name, spec in sorted(FAMILIES.items()):
            print(f"{name:16} vocab {spec.vocab:14} template {spec.template}")
        return 0
    out = args.out or ROOT / "var" / "models" / f"{args.family}-family.gguf"
    print(write_family_model(args.family, out))
    return 0

