#!/usr/bin/env python3
"""Module import graph of src/ (crate-internal `use crate::…` and `crate::x::` paths); prints
cycles (strongly connected components with more than one module)."""
import os, re, sys, collections
root = sys.argv[1] if len(sys.argv) > 1 else 'src'
mods = {}
for dp, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)[:-3].replace(os.sep, '::')
            rel = re.sub(r'(::)?mod$', '', rel) or 'lib'
            if rel in ('lib', 'main'): rel = 'lib'
            mods[rel] = open(p).read()
names = set(mods)
graph = collections.defaultdict(set)
for m, text in mods.items():
    text = re.sub(r'#\[cfg\(test\)\]\s*mod tests\s*\{.*', '', text, flags=re.S)
    for hit in re.findall(r'crate::([a-z_]+(?:::[a-z_]+)*)', text):
        parts = hit.split('::')
        for i in range(len(parts), 0, -1):
            cand = '::'.join(parts[:i])
            if cand in names and cand != m:
                graph[m].add(cand); break
index = {}; low = {}; stack = []; on = set(); sccs = []; counter = [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
    for w in graph[v]:
        if w not in index: strong(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
for v in sorted(names):
    if v not in index: strong(v)
cycles = [sorted(c) for c in sccs if len(c) > 1]
print(f"{len(names)} modules, {sum(len(v) for v in graph.values())} import edges")
for c in cycles:
    edges = sum(1 for a in c for b in graph[a] if b in c)
    print(f"cycle of {len(c)} modules ({edges} edges inside): {', '.join(c)}")
if not cycles: print("no import cycle")
