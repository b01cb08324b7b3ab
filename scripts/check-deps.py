#!/usr/bin/env python3
"""Fails when modules of a directory include each other in a cycle.

A module is X.c plus X.h in one directory (daemon/, client/); X depends on Y when either of its
files includes "DIR/Y.h". Dependencies must point one way (a lower layer reaches a higher one only
through a callback or a table it was given), so the graph must be acyclic. Prints each cycle
found, or the modules in an order where every module comes after what it depends on.

    usage: scripts/check-deps.py [DIR ...]   (default: daemon client)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def graph(directory):
    path = os.path.join(ROOT, directory)  # an absolute directory stays as it is
    prefix = os.path.basename(os.path.normpath(path))  # includes name it: "daemon/conn.h"
    inc = re.compile(r'^\s*#\s*include\s+"%s/([A-Za-z0-9_]+)\.h"' % re.escape(prefix), re.M)
    deps = {}
    for name in sorted(os.listdir(path)):
        base, ext = os.path.splitext(name)
        if ext not in (".c", ".h"):
            continue
        with open(os.path.join(path, name), encoding="utf-8") as f:
            found = set(inc.findall(f.read()))
        deps.setdefault(base, set()).update(found - {base})
    for targets in list(deps.values()):
        for t in targets:
            deps.setdefault(t, set())
    return deps


def cycles(deps):
    """Tarjan's strongly connected components: every component of more than one module is a cycle."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(deps[v]):
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

    sys.setrecursionlimit(10000)
    for v in sorted(deps):
        if v not in index:
            visit(v)
    return out


def order(deps):
    """Modules bottom up: each after everything it includes."""
    done, seq = set(), []

    def visit(v):
        if v in done:
            return
        done.add(v)
        for w in sorted(deps[v]):
            visit(w)
        seq.append(v)

    for v in sorted(deps):
        visit(v)
    return seq


def main(argv):
    dirs = argv or ["daemon", "client"]
    failed = False
    for d in dirs:
        deps = graph(d)
        found = cycles(deps)
        if found:
            failed = True
            for comp in found:
                edges = ", ".join(f"{a} -> {b}" for a in comp for b in sorted(deps[a]) if b in comp)
                print(f"check-deps: {d}/: include cycle among {' '.join(comp)} ({edges})")
        else:
            print(f"check-deps: {d}/: {len(deps)} modules, no include cycle; bottom up: {' '.join(order(deps))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
