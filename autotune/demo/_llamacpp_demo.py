"""The llama.cpp demo: the real SmolLM2-135M-Instruct GGUF, its truncated drafts, and replay
sets of real text for it.

``code``: chat requests that hand the model a short Python function and ask for it back with a
change (a docstring, type hints, a rename): like an editor's assistant, the answer copies most
of the prompt, so n-gram drafting pays. ``chat``: open questions whose answers share little with
the prompt. Every request is distinct (identifiers and topics vary), greedy, with a short
``max_tokens`` so that a server start stays within seconds on two CPU cores.
"""

from __future__ import annotations

import random
from pathlib import Path

from autotune.demo import _ggufmodels
from autotune.traffic import _replayset

_FUNCS = (
    "def {f}({a}, {b}):\n    total = 0\n    for item in {a}:\n        if item > {b}:\n            total += item\n"
    "    return total\n",
    "def {f}({a}):\n    result = []\n    for line in {a}.splitlines():\n        line = line.strip()\n"
    "        if line and not line.startswith('#'):\n            result.append(line)\n    return result\n",
    "def {f}({a}, {b}):\n    if not {a}:\n        return None\n    best = {a}[0]\n    for value in {a}[1:]:\n"
    "        if value[{b}] > best[{b}]:\n            best = value\n    return best\n",
    "def {f}({a}):\n    counts = {{}}\n    for word in {a}.split():\n        word = word.lower()\n"
    "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
    "class {F}:\n    def __init__(self, {a}):\n        self.{a} = {a}\n        self.items = []\n\n"
    "    def add(self, {b}):\n        self.items.append({b})\n        return len(self.items)\n",
)
_ASKS = ("Add a docstring to this function and return the whole code.",
         "Add type hints to this code and show the full result.",
         "Rename the variables to clearer names and print the complete code.",
         "Repeat this code exactly, then explain it in one sentence.")
_NAMES = ("data", "values", "rows", "text", "records", "limit", "key", "index", "items", "blob", "source",
          "threshold", "column", "payload", "entries", "batch")
_VERBS = ("sum", "parse", "pick", "count", "load", "scan", "merge", "filter", "collect", "find")
_NOUNS = ("scores", "lines", "users", "orders", "words", "events", "files", "prices")
_TOPICS = ("the history of tea", "how volcanoes form", "why the sky is blue", "the rules of chess",
           "how bread rises", "the life of bees", "how rainbows appear", "the first computers",
           "how to learn a language", "why cats purr", "how airplanes fly", "the water cycle",
           "the moon landing", "how to plant tomatoes", "the Roman empire", "what makes music sad")
_CHAT = ("Tell me about {t}.", "Explain {t} to a child.", "Give me three facts about {t}.",
         "Write a short paragraph on {t}.", "What should everyone know about {t}?")

KINDS = ("code", "chat")


def _code_prompt(rng: random.Random) -> str:
    a, b = rng.sample(_NAMES, 2)
    fn = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
    src = rng.choice(_FUNCS).format(f=fn, F=fn.title().replace("_", ""), a=a, b=b)
    return f"{rng.choice(_ASKS)}\n\n```python\n{src}```"


def replay_requests(kind: str, n: int, seed: int = 0, max_tokens: int = 48) -> list[_replayset.ReplayRequest]:
    if kind not in KINDS:
        raise ValueError(f"unknown llama.cpp demo traffic kind {kind!r}; one of {', '.join(KINDS)}")
    rng = random.Random(f"llamacpp-{kind}-{seed}")
    out, seen = [], set()
    while len(out) < n:
        if kind == "code":
            text = _code_prompt(rng)
        else:
            text = rng.choice(_CHAT).format(t=rng.choice(_TOPICS))
            text += f" (Answer #{len(out) + 1}.)" if text in seen else ""
        if text in seen:
            continue  # never the same request twice: caches would remember it
        seen.add(text)
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
        out.append(_replayset.ReplayRequest(id=f"{kind}-llamacpp-{len(out):04d}", endpoint="chat", body=body,
                                            tag=kind, ts=1_790_000_000.0 + len(out)))
    return out


def setup(home: str | Path = ".autotune", requests: int = 68) -> dict[str, Path]:
    """The GGUF target and drafts (``_ggufmodels``) and the replay sets ``code-llamacpp`` and
    ``chat-llamacpp`` (idempotent). Returns the paths written."""
    home = Path(home)
    paths = {f"model:{k}": v for k, v in _ggufmodels.build_all(home / "models").items()}
    for kind in KINDS:
        paths[f"replay:{kind}-llamacpp"] = _replayset.save(home / "replay" / f"{kind}-llamacpp.jsonl",
                                                           replay_requests(kind, requests))
    return paths
