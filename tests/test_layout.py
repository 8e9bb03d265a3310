"""The package layout stays readable: imports point one way down the pipeline, with no cycles.

Stages, bottom to top (each may import its own stage and the ones before it):
core, traffic, replay, engines, search, decide, trust, report, ops, demo, cli. Outside ``cli``,
an import of autotune itself inside a function is refused (it hides a dependency, usually one
that dodges a cycle); ``cli`` imports its commands' machinery lazily so that ``autotune --help``
stays fast, and those imports obey the same direction.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "autotune"
STAGES = ["core", "traffic", "replay", "engines", "search", "decide", "trust", "report", "ops", "demo", "cli"]
PACKAGES = STAGES + ["testing"]
LAZY_OK = {"cli"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
        if not base.startswith("autotune"):
            return []
        return [f"{base}.{a.name}" for a in node.names]
    parts = mod.split(".")
    if not is_pkg:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" for a in node.names]


def import_graph() -> tuple[set[str], dict[str, set[str]], list[tuple[str, str]]]:
    """(modules, edges module -> imported modules, [(module, target)] of imports inside functions)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in files}
    lazy: list[tuple[str, str]] = []
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("autotune")]
            elif isinstance(node, ast.ImportFrom):
                targets = _resolve(mod, path.name == "__init__.py", node)
            else:
                continue
            for t in targets:
                # "from pkg import name": the module pkg.name if there is one, else pkg itself
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if not t or t == mod:
                    continue
                edges[mod].add(t)
                if id(node) not in top:
                    lazy.append((mod, t))
    return set(files), edges, lazy


def stage_of(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def package_of(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else None


def may_import(package: str) -> set[str]:
    """The packages ``autotune/<package>/__init__.py`` says it may import: its docstring's
    "May import:" sentence names them (``core``, ``traffic``), a range (``core`` .. ``search``:
    every stage between), or "anything". The docstring is the rule; the test holds the code to it."""
    doc = ast.get_docstring(ast.parse((PKG / package / "__init__.py").read_text())) or ""
    m = re.search(r"May import:(.*?)(?:\.\s*$|\.\s+[A-Z])", doc, re.S | re.M)
    assert m, f"autotune/{package}/__init__.py: no 'May import: ...' sentence in its docstring"
    text = m.group(1)
    if "anything" in text:
        return set(PACKAGES)
    names = set(re.findall(r"``(\w+)``", text))
    for lo, hi in re.findall(r"``(\w+)``\s*\.\.\s*``(\w+)``", text):
        names |= set(STAGES[STAGES.index(lo): STAGES.index(hi) + 1])
    unknown = names - set(PACKAGES)
    assert not unknown, f"autotune/{package}/__init__.py names no such package: {sorted(unknown)}"
    return names


def test_every_module_lives_in_a_stage():
    mods, _, _ = import_graph()
    loose = sorted(m for m in mods if m.count(".") == 1 and m.split(".")[1] not in STAGES + ["testing"]
                   and m not in ("autotune.__main__",))
    assert not loose, f"modules outside the stage packages: {loose}"
    for stage in STAGES:
        init = PKG / stage / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), \
            f"autotune/{stage}/__init__.py must say what the stage owns and may import"


def test_imports_point_down_the_pipeline():
    _, edges, _ = import_graph()
    upward = []
    for mod, targets in edges.items():
        s = stage_of(mod)
        for t in targets:
            ts = stage_of(t)
            if s and ts and STAGES.index(ts) > STAGES.index(s):
                upward.append(f"{mod} -> {t}")
    assert not upward, "upward imports between stages:\n" + "\n".join(sorted(upward))


def test_each_package_imports_only_what_its_init_lists():
    """Each package's own import list (its ``__init__``'s "May import:"), autotune/testing included:
    tighter than the pipeline order (demo may import core and traffic, not the engines)."""
    _, edges, _ = import_graph()
    allowed = {p: may_import(p) | {p} for p in PACKAGES}
    bad = sorted(f"{mod} -> {t}" for mod, targets in edges.items() for t in targets
                 if package_of(mod) and package_of(t) and package_of(t) not in allowed[package_of(mod)])
    assert not bad, "imports a package's __init__ does not list:\n" + "\n".join(bad)


def test_nothing_in_the_tuner_imports_the_test_helpers():
    _, edges, _ = import_graph()
    users = sorted(f"{mod} -> {t}" for mod, targets in edges.items() for t in targets
                   if package_of(t) == "testing" and package_of(mod) != "testing")
    assert not users, "autotune.testing is for tests and benchmarks only:\n" + "\n".join(users)


def test_the_import_list_check_can_fail(tmp_path, monkeypatch):
    """A demo module importing the engines, which demo's __init__ does not list, is reported."""
    pkg = tmp_path / "autotune"
    for p in PACKAGES:
        (pkg / p).mkdir(parents=True)
        (pkg / p / "__init__.py").write_text(f'"""{p}.\nMay import: ``core``.\n"""\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "demo" / "_a.py").write_text("from autotune.engines import _b\n")
    (pkg / "engines" / "_b.py").write_text("X = 1\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PKG"]), "PKG", pkg)
    with pytest.raises(AssertionError, match="autotune.demo._a -> autotune.engines._b"):
        test_each_package_imports_only_what_its_init_lists()
    assert may_import("core") == {"core"}


def test_no_import_cycles():
    _, edges, _ = import_graph()
    # Tarjan's strongly connected components; the package __init__ re-exports are leaves here
    edges = {m: {t for t in ts if t != "autotune"} for m, ts in edges.items() if m != "autotune"}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_hidden_imports_of_autotune_outside_the_cli():
    _, _, lazy = import_graph()
    hidden = sorted(f"{m} -> {t}" for m, t in lazy if stage_of(m) not in LAZY_OK)
    assert not hidden, "autotune imported inside a function (move it to the top):\n" + "\n".join(hidden)


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The check itself can fail: a fake package with core importing search is caught."""
    pkg = tmp_path / "autotune"
    for stage in ("core", "search"):
        (pkg / stage).mkdir(parents=True)
        (pkg / stage / "__init__.py").write_text('"""x"""\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "_a.py").write_text("from autotune.search._b import f\n")
    (pkg / "search" / "_b.py").write_text("def f():\n    from autotune.core import _a\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PKG"]), "PKG", pkg)
    _, edges, lazy = import_graph()
    assert "autotune.search._b" in edges["autotune.core._a"]
    assert ("autotune.search._b", "autotune.core._a") in lazy
    try:
        test_imports_point_down_the_pipeline()
    except AssertionError as e:
        assert "autotune.core._a -> autotune.search._b" in str(e)
    else:
        raise AssertionError("an upward import was not reported")
    try:
        test_no_import_cycles()
    except AssertionError as e:
        assert "autotune.core._a" in str(e)
    else:
        raise AssertionError("an import cycle was not reported")
