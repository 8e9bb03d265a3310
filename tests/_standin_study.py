"""``autotune`` in a process of its own with a stand-in engine, for faults that need a process to
die or a database to break while a study runs: the probe answers as vLLM 0.32 would and each
server start is the synthetic workload's measurement (``test_search_study.fake_measure``).

    python tests/_standin_study.py study start --workload syn --spec syn.yaml

``AUTOTUNE_STANDIN_FAULT`` picks the fault, at the start of the study's server start N (0: the
baseline), counted in this process:

- ``break-db-at:N``: the SQLite file is copied to ``<db>.saved``, then overwritten in place (the
  database is unusable from then on; copying ``.saved`` back is the database coming back).
- ``hang-at:N``: ``<AUTOTUNE__HOME>/hung`` is written and the start never ends (a test kills it).

Every start made is appended to ``<AUTOTUNE__HOME>/starts.jsonl`` (its config), across processes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import Workload  # noqa: E402
from test_search_study import RATES, fake_measure  # noqa: E402

from autotune.cli._main import main  # noqa: E402
from autotune.engines import _probe  # noqa: E402
from autotune.engines._probe import Capabilities  # noqa: E402
from autotune.search import _study  # noqa: E402

CAPS = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                    "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)


def _standin():
    inner = fake_measure(Workload(rates=RATES))
    fault, _, at = os.environ.get("AUTOTUNE_STANDIN_FAULT", "").partition(":")
    home = Path(os.environ["AUTOTUNE__HOME"])

    def measure(spec, config, *a, **kw):
        n = len(inner.calls)
        if fault == "break-db-at" and n == int(at):
            db = Path(spec.storage.removeprefix("sqlite:///"))
            shutil.copy(db, db.with_name(db.name + ".saved"))
            with open(db, "r+b") as fh:
                fh.write(b"\0not a database" * 512)
        if fault == "hang-at" and n == int(at):
            (home / "hung").write_text(str(os.getpid()))
            while True:
                time.sleep(60)
        home.mkdir(parents=True, exist_ok=True)
        with open(home / "starts.jsonl", "a") as fh:
            fh.write(json.dumps(config) + "\n")
        return inner(spec, config, *a, **kw)

    return measure


if __name__ == "__main__":
    _probe.probe = lambda *a, **k: CAPS
    _study.measure = _standin()
    main(sys.argv[1:], prog_name="autotune")
