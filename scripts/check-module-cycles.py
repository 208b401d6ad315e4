#!/usr/bin/env python3
"""No import circle inside any crate.

Builds each crate's module graph from its sources under crates/*/src and
prints every strongly connected group of modules (a circle of imports).
Edges: `crate::` and `super::` paths, relative child paths (`name::`), and
paths inside strings (serde attributes such as `try_from = "crate::x::T"`)
and doc links. A crate's root (lib.rs/main.rs) is not a module here, and a
`#[cfg(test)] mod tests` tail of a file is ignored.

Exits 1 when a group is not in ALLOWED; warns when ALLOWED names a group
that no longer exists exactly (then shrink the list). Only python3 is
needed.

Usage: scripts/check-module-cycles.py [ROOT] [--graph]
  ROOT     the workspace (default: this script's parent directory)
  --graph  also print each crate's edges (module -> the modules it uses)
"""
import os
import re
import sys

# Accepted groups, by crate: the exact set of modules. None today: keep it
# that way (a stage that needs its parent's state takes it as an argument).
ALLOWED: set = set()


def modname(crate_src, path):
    rel = os.path.relpath(path, crate_src)[:-3]
    parts = rel.split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts) or "crate"


def crate_graph(src):
    edges = {}
    for dp, _, fs in os.walk(src):
        for f in fs:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(dp, f)
            m = modname(src, p)
            with open(p, encoding="utf-8") as fh:
                txt = fh.read()
            # The unit tests at the end of a file are not its imports.
            txt = re.split(r"#\[cfg\(test\)\]\s*mod tests", txt)[0]
            deps = set()
            for kind, path in re.findall(
                r"\b(crate|super)::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)", txt
            ):
                if kind == "crate":
                    tgt = path.split("::")
                else:
                    base = m.split("::")
                    base = base[:-1] if base != ["crate"] else []
                    tgt = base + path.split("::")
                deps.add("::".join(tgt))
            for name in re.findall(r"(?<![:\w])(?:self::)?([a-z_][a-z0-9_]*)::", txt):
                deps.add(("" if m == "crate" else m + "::") + name)
            edges[m] = deps
    mods = set(edges)

    def norm(t):
        parts = t.split("::")
        if parts[0] == "crate":
            parts = parts[1:]
        for i in range(len(parts), 0, -1):
            c = "::".join(parts[:i])
            if c in mods:
                return c
        return None

    return {m: set(filter(None, (norm(t) for t in ds))) - {m} for m, ds in edges.items()}


def sccs(g):
    """Tarjan's algorithm, iterative; groups of more than one module."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


def main(argv):
    show_graph = "--graph" in argv
    args = [a for a in argv if a != "--graph"]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    found = set()
    bad = []
    for crate in sorted(os.listdir(os.path.join(root, "crates"))):
        src = os.path.join(root, "crates", crate, "src")
        if not os.path.isdir(src):
            continue
        g = crate_graph(src)
        if show_graph:
            for m in sorted(g):
                print(f"{crate} {m} -> {', '.join(sorted(g[m])) or '-'}")
        for comp in sccs(g):
            key = (crate, frozenset(comp))
            found.add(key)
            allowed = key in ALLOWED
            print(crate, comp, "(allowed)" if allowed else "(CIRCLE)")
            if not allowed:
                bad.append(key)
    stale = ALLOWED - found
    for crate, comp in sorted(stale, key=lambda k: (k[0], sorted(k[1]))):
        print(f"warning: {crate} {sorted(comp)} is allowed but no longer a group; update ALLOWED")
    if bad:
        print(f"module cycles: {len(bad)} not allowed", file=sys.stderr)
        return 1
    print("module cycles: none beyond the allowed groups")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
