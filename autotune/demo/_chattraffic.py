"""Chat traffic from real text, for the real-model demo workloads ``chat-smollm2`` and
``mixed-smollm2``.

Three kinds of request take turns, as an assistant's chat traffic mixes them:

- ``summary``: one real paragraph of English prose (from the docstrings of the Python standard
  library that ships with the interpreter) and a request to summarise it. The answer reuses some
  of the paragraph's words, so n-gram drafting finds a little; much less than in a code edit.
- ``explain``: explain a concept named in the request (no text to copy).
- ``advice``: advice for a situation named in the request (no text to copy).

Greedy, with the same short ``max_tokens`` as the code traffic, written as gateway logs through
``_codetraffic.log_lines`` so ``autotune traffic import`` / ``sample`` make the replay sets. The
same interpreter and seed give the same requests.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import random
import re

from autotune.demo._codetraffic import MODULES, TrafficGenError, requests as code_requests

KINDS = ("summary", "explain", "advice")
MIN_CHARS, MAX_CHARS = 240, 900
_EXTRA_MODULES = ("abc", "asyncio.locks", "collections", "contextlib", "decimal", "enum", "functools",
                  "hashlib", "logging", "numbers", "operator", "queue", "sched", "selectors",
                  "socketserver", "threading", "typing", "unittest.case", "uuid", "weakref")
_SUMMARY = ("Summarize this paragraph in two sentences.", "What is the main point of this paragraph?",
            "Explain this paragraph in plain words.", "Give a one-paragraph summary of the text below.")
_CONCEPTS = ("a hash table", "recursion", "a race condition", "garbage collection", "a database index",
             "public-key encryption", "a compiler", "an operating system", "caching", "unit testing",
             "version control", "a neural network", "floating-point rounding", "a binary search",
             "an API", "a memory leak", "latency and throughput", "a deadlock", "virtual memory",
             "the difference between a process and a thread", "regular expressions", "big-O notation")
_HOW = ("Explain {c} in simple terms.", "What is {c}, and why does it matter?",
        "Describe {c} to someone new to programming.", "Give an everyday analogy for {c}.")
_SITUATIONS = ("is starting their first programming job", "has to give a talk next week",
               "wants to sleep better", "is learning a second language", "must review a large pull request",
               "is moving to a new city", "wants to run a first marathon", "is preparing for a job interview",
               "has too many meetings", "wants to read more books", "is mentoring a new colleague",
               "needs to pay off a small debt", "wants to cook more at home", "is switching careers at forty",
               "keeps missing deadlines", "wants to start a vegetable garden", "is leading a team for the first time",
               "wants to learn to draw", "is writing a first novel", "has a noisy neighbour",
               "is planning a trip abroad", "wants to save for a house", "struggles to focus at home",
               "is adopting a dog")
_ASK = ("What advice would you give someone who {s}?", "List a few tips for a person who {s}.",
        "How should someone who {s} get started?", "My friend {s}. What should they do first?")


def _prose(text: str) -> list[str]:
    """The docstring's paragraphs that read as prose: no code, tables or option lists."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in para.strip().splitlines()]
        flat = " ".join(lines)
        if not (MIN_CHARS <= len(flat) <= MAX_CHARS) or flat.count(".") < 2:
            continue
        if any(ln.startswith((">>>", "-", "*", "+", "|", "=", ":")) for ln in lines) or \
                sum(ch in "{}[]()=<>_`\\" for ch in flat) > len(flat) / 40:
            continue
        out.append(flat)
    return out


@functools.cache
def paragraphs() -> tuple[str, ...]:
    """Prose paragraphs of stdlib module docstrings, in module order (read from the source
    files, not imported: nothing runs)."""
    seen, out = set(), []
    for name in MODULES + _EXTRA_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        try:
            with open(spec.origin, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        docs = [ast.get_docstring(tree)] + [ast.get_docstring(n) for n in ast.walk(tree)
                                            if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
        for doc in docs:
            for p in _prose(doc or ""):
                if p not in seen:
                    seen.add(p)
                    out.append(p)
    return tuple(out)


def requests(n: int, seed: int = 0, max_tokens: int = 96) -> list[dict]:
    """``n`` distinct greedy chat request bodies, the kinds in turn."""
    if n < 1:
        raise TrafficGenError(f"n must be at least 1, not {n}")
    paras = list(paragraphs())
    if len(paras) < n // len(KINDS) + 1:
        raise TrafficGenError(f"only {len(paras)} prose paragraphs found in the stdlib docstrings; "
                              f"{n} requests need {n // len(KINDS) + 1}")
    rng = random.Random(f"chat-traffic-{seed}")
    rng.shuffle(paras)
    out, seen = [], set()
    for _ in range(100 * n):
        kind = KINDS[len(out) % len(KINDS)]
        if kind == "summary":
            text = f"{rng.choice(_SUMMARY)}\n\n{paras.pop()}"
        elif kind == "explain":
            text = rng.choice(_HOW).format(c=rng.choice(_CONCEPTS))
        else:
            text = rng.choice(_ASK).format(s=rng.choice(_SITUATIONS))
        if text in seen:
            continue  # never the same request twice: a cache would remember it
        seen.add(text)
        out.append({"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0})
        if len(out) == n:
            return out
    raise TrafficGenError(f"only {len(out)} distinct chat requests of the {n} asked for")


def mixed_requests(n: int, seed: int = 0, max_tokens: int = 96, code_share: float = 0.5) -> list[dict]:
    """``n`` requests, each a code edit with probability ``code_share`` and a chat request
    otherwise (seeded): one workload whose requests disagree on the best K."""
    if not 0 <= code_share <= 1:
        raise TrafficGenError(f"code_share must be between 0 and 1, not {code_share}")
    rng = random.Random(f"mixed-traffic-{seed}")
    is_code = [rng.random() < code_share for _ in range(n)]
    code = iter(code_requests(max(1, sum(is_code)), seed, max_tokens))
    chat = iter(requests(max(1, n - sum(is_code)), seed, max_tokens))
    return [next(code) if c else next(chat) for c in is_code]
