"""Workload tagging of imported traffic: which study a logged request belongs to.

Order, first answer wins:

1. ``--workload W`` on the command line (forces every imported request);
2. an explicit tag the log carries: the first non-empty string among ``TAG_FIELDS``, looked up in
   the log record and then in the request body (``metadata.workload`` is where OpenAI-style
   clients put it);
3. the study specs' ``traffic.rules`` (``{workload, model: regex, regex: regex, keywords: [...]}``;
   every condition a rule gives must match; the first matching rule wins);
4. the default classifier: ``code`` when the prompt has a fenced code block, names a source file
   (``main.py``, ``src/app.tsx``) or is dense in code keywords and symbols; otherwise ``chat``.

Tags are made safe as workload and file names: characters outside ``[A-Za-z0-9_.-]`` become ``-``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from autotune.core._names import MAX_NAME

# Dotted paths, looked up in the log record, then in the request body.
TAG_FIELDS = ("workload", "tag", "metadata.workload", "metadata.tag", "metadata.workload_tag",
              "metadata.tags.workload", "labels.workload", "request.metadata.workload",
              "extra_body.metadata.workload")

DEFAULT_WORKLOAD = "chat"
CODE_WORKLOAD = "code"
_MAX_CLASSIFY_CHARS = 20_000

_FENCE = re.compile(r"```|~~~")
_SOURCE_FILE = re.compile(
    r"\w\.(?:py|ipynb|js|mjs|cjs|ts|tsx|jsx|java|kt|kts|go|rs|c|cc|cpp|cxx|h|hpp|cs|rb|php|swift|scala|"
    r"sql|sh|bash|zsh|ps1|lua|jl|dart|vue|svelte|css|scss|html|yaml|yml|toml|gradle|proto|tf|hcl|ex|exs|"
    r"erl|hs|ml|clj|groovy|cmake|mk)\b")


def _patterns(pairs):
    """(substring, regex): the regex only runs when the substring occurs, which keeps prose fast."""
    return [(hint, re.compile(rx, re.MULTILINE)) for hint, rx in pairs]


# Constructs that hardly occur in prose (strong) and code-ish tokens (weak).
_STRONG = _patterns([
    ("def ", r"\bdef \w+\s*\("), ("class ", r"\bclass \w+\s*[:({]"),
    ("import", r"^\s*(?:import \w|from [\w.]+ import\b)"), ("import", r"\bimport\s*\{"),
    ("function", r"\bfunction\s*\w*\s*\("), ("=", r"\b(?:const|let|var) \w+\s*="),
    ("#include", r"#include\s*[<\"]"), ("public ", r"\bpublic (?:static |final )*\w+"),
    ("fn ", r"\bfn \w+\s*\("), ("func ", r"\bfunc \w+\s*\("),
    ("SELECT", r"\bSELECT\b[^;]{1,300}?\bFROM\b[^;]{1,300}?\b(?:WHERE|JOIN|GROUP BY|ORDER BY|LIMIT)\b"),
    ("console.log(", r"console\.log\("), ("printf(", r"\bprintf\("), ("std::", r"\bstd::"),
    ("export ", r"\bexport (?:default|const|function|class)\b"), ("{", r"\b(?:if|for|while) ?\(.*\)\s*\{"),
])
_WEAK_LITERALS = ("=>", "()", "!=", "==", "&&", "||", "+=", "->", "${", "print(")
_WEAK = _patterns([
    ("self.", r"\bself\.\w"), ("this.", r"\bthis\.\w"), ("::", r"\w::\w"),
    ("return", r"\breturn\b[^.\n]*;"), ("@", r"^\s*@\w+"), (";", r";\s*$"),
])
_SYMBOLS = "{}[]();=<>"
_DROP_SYMBOLS = str.maketrans("", "", _SYMBOLS)


def slug(tag: str) -> str | None:
    """A workload name usable as a file name (``core._names``), or None when nothing is left."""
    s = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]+", "-", tag.strip())).strip("-._")
    return s[:MAX_NAME].rstrip("-._") or None


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def explicit_tag(*objects: Any) -> str | None:
    """The first tag found in ``objects`` (log record, then request body), slugged."""
    for obj in objects:
        for field in TAG_FIELDS:
            v = _get(obj, field)
            if isinstance(v, str) and v.strip():
                return slug(v)
    return None


def prompt_text(endpoint: str, body: dict) -> str:
    """The prompt's text: a completions prompt, or every message's text content joined."""
    if endpoint == "completions":
        p = body.get("prompt")
        if isinstance(p, str):
            return p
        if isinstance(p, list):
            return "\n".join(x for x in p if isinstance(x, str))
        return ""
    parts: list[str] = []
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(parts)


def looks_like_code(text: str) -> bool:
    """Default classifier; documented in the module docstring. Cheap: reads 20k characters at most."""
    text = text[:_MAX_CLASSIFY_CHARS]
    if not text.strip():
        return False
    if _FENCE.search(text) or _SOURCE_FILE.search(text):
        return True
    strong = sum(len(rx.findall(text)) for hint, rx in _STRONG if hint in text)
    weak = (sum(text.count(lit) for lit in _WEAK_LITERALS)
            + sum(len(rx.findall(text)) for hint, rx in _WEAK if hint in text))
    density = (len(text) - len(text.translate(_DROP_SYMBOLS))) / len(text)
    return (strong >= 2 or (strong >= 1 and (weak >= 1 or density >= 0.015))
            or (weak >= 3 and density >= 0.02) or (weak >= 1 and density >= 0.06))


@dataclass(frozen=True)
class _Rule:
    workload: str
    model: re.Pattern | None
    regex: re.Pattern | None
    keywords: tuple[str, ...]


class Classifier:
    """Tags requests: forced workload > explicit tag > spec rules > default classifier.

    ``rules`` are ``TrafficRule`` objects from study specs (or anything with the same attributes).
    ``classify`` returns ``(workload, how)`` with ``how`` one of ``forced``, ``tag``, ``rule``,
    ``default``.
    """

    def __init__(self, rules: Iterable[Any] = (), force: str | None = None):
        self.force = slug(force) if force else None
        self.rules = [_Rule(r.workload, re.compile(r.model) if r.model else None,
                            re.compile(r.regex) if r.regex else None,
                            tuple(k.lower() for k in (r.keywords or ())))
                      for r in rules]

    def classify(self, *, tag: str | None, model: str | None, text: str) -> tuple[str, str]:
        if self.force:
            return self.force, "forced"
        if tag:
            return tag, "tag"
        lowered = None
        for r in self.rules:
            if r.model is not None and not (model and r.model.search(model)):
                continue
            if r.regex is not None and not r.regex.search(text):
                continue
            if r.keywords:
                lowered = lowered if lowered is not None else text.lower()
                if not any(_keyword_in(k, lowered) for k in r.keywords):
                    continue
            return r.workload, "rule"
        return (CODE_WORKLOAD if looks_like_code(text) else DEFAULT_WORKLOAD), "default"


def _keyword_in(keyword: str, lowered_text: str) -> bool:
    """Whole-word match when the keyword starts and ends with word characters, else substring."""
    if re.fullmatch(r"\w(.*\w)?", keyword, re.DOTALL):
        return re.search(rf"(?<!\w){re.escape(keyword)}(?!\w)", lowered_text) is not None
    return keyword in lowered_text
