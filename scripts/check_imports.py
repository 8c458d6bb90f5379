#!/usr/bin/env python3
"""Checks what the crates cannot: no import circle among the modules of one crate (the
library's layers are crates, so a wrong-way import between them does not compile), nor among
the Python package's modules.

A module is a file. Its imports are the paths it names (`use crate::a::b`, `crate::a::b::f()`
inline, `super::x`), outside comments and its `#[cfg(test)]` module, resolved to the file that
defines them; a name the crate root or a `mod.rs` only re-exports (`pub use m::Name`) resolves
to `m`. The crate root declares the modules and is not one of them.

    python3 scripts/check_imports.py        # exit 1, naming each circle
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each crate's sources: a module may import any other of its crate, but never one that imports
# it back.
CRATES = ["crates/format/src", "crates/core/src", "src", "crates/c/src", "cli/src"]


def modules(src: Path) -> dict[str, Path]:
    """Module path (`flush::writer`, `` for the root) -> file."""
    out = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
            parts = parts[:-1]
        out["::".join(parts)] = f
    return out


def code_of(text: str) -> str:
    """The text without comments and without the `#[cfg(test)] mod tests { ... }` block."""
    text = re.sub(r"//[^\n]*", "", text)
    m = re.search(r"#\[cfg\(test\)\]\s*mod \w+ \{", text)
    if m:
        text = text[: m.start()]
    return text


def reexports(code: str, here: str) -> dict[str, str]:
    """Names `here` re-exports with `pub use`: name -> the module path it comes from."""
    out = {}
    for m in re.finditer(r"pub(?:\([^)]*\))? use ([\w:]+)::\{([^}]*)\};|pub(?:\([^)]*\))? use ([\w:]+)::(\w+);", code):
        base = m.group(1) or m.group(3)
        names = m.group(2).split(",") if m.group(2) else [m.group(4)]
        for n in names:
            n = n.strip().split(" as ")[-1].strip()
            if n and n != "self":
                out[n] = absolute(base, here)
    return out


def absolute(path: str, here: str) -> str:
    parts = path.split("::")
    base = here.split("::") if here else []
    if parts[0] == "crate":
        return "::".join(parts[1:])
    if parts[0] == "super":
        while parts and parts[0] == "super":
            parts = parts[1:]
            base = base[:-1]
        return "::".join(base + parts)
    if parts[0] == "self":
        return "::".join(base + parts[1:])
    # A path relative to `here` (a child module named in `pub use child::X`).
    return "::".join(base + parts)


def resolve(path: str, mods: dict[str, Path], exports: dict[str, dict[str, str]], depth=0) -> str | None:
    """The module a path lands in: its longest prefix that is a module, following re-exports
    of the root and of `mod.rs` files."""
    parts = path.split("::")
    for n in range(len(parts), 0, -1):
        prefix = "::".join(parts[:n])
        if prefix in mods:
            rest = parts[n:]
            if rest and rest[0] in exports.get(prefix, {}) and depth < 8:
                return resolve(exports[prefix][rest[0]], mods, exports, depth + 1) or prefix
            return prefix
    if parts and parts[0] in exports.get("", {}) and depth < 8:
        return resolve(exports[""][parts[0]], mods, exports, depth + 1)
    return None


def inline_mods(code: str) -> list[tuple[int, int, str]]:
    """The inline `mod name { ... }` blocks of a file: (start, end, name)."""
    out = []
    for m in re.finditer(r"\bmod (\w+) \{", code):
        depth, i = 0, m.end() - 1
        while i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            if depth == 0:
                break
            i += 1
        out.append((m.start(), i, m.group(1)))
    return out


def here_at(m: str, blocks: list[tuple[int, int, str]], pos: int) -> str:
    """The module a position of file module `m` is in (inside inline modules)."""
    names = [name for start, end, name in blocks if start <= pos <= end]
    return "::".join([m] + names) if m else "::".join(names)


def edges(src: Path) -> tuple[dict[str, set[str]], dict[str, Path]]:
    mods = modules(src)
    codes = {m: code_of(f.read_text()) for m, f in mods.items()}
    exports = {m: reexports(c, m) for m, c in codes.items()}
    graph: dict[str, set[str]] = {m: set() for m in mods if m}
    for m, code in codes.items():
        if not m:
            continue
        blocks = inline_mods(code)
        # `use a::{b, c::d}` groups, flattened one level.
        for u in re.finditer(r"\buse ((?:crate|super|self)[\w:]*)::\{([^;]*)\};", code):
            here = here_at(m, blocks, u.start())
            for item in re.split(r",\s*", u.group(2)):
                item = item.strip().split(" as ")[0].strip("{} ")
                if item and item != "self":
                    add(graph, m, here, u.group(1) + "::" + item, mods, exports)
                elif item == "self":
                    add(graph, m, here, u.group(1), mods, exports)
        for p in re.finditer(r"\b((?:crate|super)(?:::\w+)+)", code):
            add(graph, m, here_at(m, blocks, p.start()), p.group(1), mods, exports)
        # A directory module's `use child::...` of its own submodules.
        for u in re.finditer(r"\buse (\w+)::", code):
            if f"{m}::{u.group(1)}" in mods:
                add(graph, m, m, "self::" + u.group(1), mods, exports)
    return graph, mods


def add(graph, m, here, path, mods, exports):
    target = resolve(absolute(path, here), mods, exports)
    if target and target != m:
        graph[m].add(target)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def python_edges(pkg: Path) -> dict[str, set[str]]:
    """The Python package's modules (`stepscope.vllm.config`) and the package modules each
    imports, at the top or inside a function, the package root (`stepscope`, which only
    re-exports) left out."""
    names = {}
    for f in sorted(pkg.rglob("*.py")):
        parts = list(f.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = f
    graph: dict[str, set[str]] = {m: set() for m in names}
    root = pkg.name
    for m, f in names.items():
        if m == root:
            continue
        code = re.sub(r"#[^\n]*", "", f.read_text())
        targets = set(re.findall(r"^\s*import ([\w.]+)", code, re.M))
        froms = re.findall(r"^\s*from ([\w.]+) import \(([^)]*)\)", code, re.M)
        froms += re.findall(r"^\s*from ([\w.]+) import ([^(\n]+)$", code, re.M)
        for base, items in froms:
            targets.add(base)
            targets.update(f"{base}.{i.split(' as ')[0].strip()}" for i in items.split(","))
        for t in targets:
            while t and t not in names:
                t = t.rpartition(".")[0]
            if t and t != root and t != m:
                graph[m].add(t)
    return graph


def main() -> int:
    failures = []
    graph = python_edges(ROOT / "python" / "stepscope")
    for comp in circles(graph):
        failures.append(f"python/stepscope: import circle among {comp}")
    print(f"python/stepscope: {len(graph)} modules, {sum(map(len, graph.values()))} imports")
    for name in CRATES:
        graph, _ = edges(ROOT / name)
        for comp in circles(graph):
            inner = {m: sorted(graph[m] & set(comp)) for m in comp}
            failures.append(f"{name}: import circle among {comp}: {inner}")
        print(f"{name}: {len(graph)} modules, {sum(map(len, graph.values()))} imports")
    for f in failures:
        print("check_imports:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
