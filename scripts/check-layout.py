#!/usr/bin/env python3
"""Checks the code's layout rules (docs/architecture.md): in every crate the modules import one another without a
circle, no module imports an item through the crate root's re-exports (`use crate::Item` where Item is not a
module), and no Rust or WGSL source file is over 600 lines. Prints each breach and exits 1 when there is one.

A module's imports are the `crate::` paths in its code outside comments and its `mod tests`; a path names the
longest module it starts with. Parent and child modules may use each other (a child is part of its parent)."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MAX_LINES = 600


def modules(src):
    """Module path ('' for the crate root) → source text, for every .rs file under src."""
    found = {}
    for folder, _, files in os.walk(src):
        for name in files:
            if name.endswith(".rs"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, src)[:-3].split(os.sep)
                if parts[-1] == "mod":
                    parts = parts[:-1]
                if parts in (["lib"], ["main"]):
                    parts = []
                found["::".join(parts)] = open(path, encoding="utf-8").read()
    return found


def code_of(text):
    """The text without comments and without the unit tests at its end."""
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", text, flags=re.S)


def used_paths(code):
    """Every `crate::a::b…` path a module names, with `use crate::{…}` groups expanded one level."""
    paths = []
    for group in re.finditer(r"use crate::\{([^;]*)\};", code):
        paths += [p.strip().split("::{")[0] for p in re.split(r",(?![^{]*\})", group.group(1)) if p.strip()]
    code = re.sub(r"use crate::\{[^;]*\};", "", code)
    paths += re.findall(r"crate::((?:[A-Za-z_][A-Za-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)*)", code)
    return paths


def related(a, b):
    return a == b or a.startswith(b + "::") or b.startswith(a + "::") or "" in (a, b)


def check_crate(name, src, breaches):
    mods = modules(src)
    edges = {m: set() for m in mods}
    for module, text in mods.items():
        for path in used_paths(code_of(text)):
            parts = path.split("::")
            target = next(("::".join(parts[:i]) for i in range(len(parts), 0, -1) if "::".join(parts[:i]) in mods), None)
            if target is None:
                breaches.append(f"{name}: {module or 'the root'} imports crate::{path} through the crate root")
            elif not related(module, target):
                edges[module].add(target)
    # Strongly connected components of more than one module are circles.
    index, low, stack, on, counter = {}, {}, [], set(), [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                breaches.append(f"{name}: the modules {', '.join(sorted(component))} import one another in a circle")

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)


def main():
    breaches = []
    crates = os.path.join(ROOT, "crates")
    for name in sorted(os.listdir(crates)):
        src = os.path.join(crates, name, "src")
        if os.path.isdir(src):
            check_crate(name, src, breaches)
    for top in ("crates", "shaders", "fuzz"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            if "target" in folder.split(os.sep):
                continue
            for file in files:
                if file.endswith((".rs", ".wgsl")):
                    path = os.path.join(folder, file)
                    lines = sum(1 for _ in open(path, encoding="utf-8"))
                    if lines > MAX_LINES:
                        breaches.append(f"{os.path.relpath(path, ROOT)}: {lines} lines (at most {MAX_LINES})")
    for breach in breaches:
        print(breach)
    if breaches:
        sys.exit(1)
    print("layout: no import circles, no imports through a crate root, no source file over 600 lines")


if __name__ == "__main__":
    main()
