#!/usr/bin/env python3
"""Which module folder (room) of src/ uses which, and whether any use points up.

    python3 .ci/layers.py            # summary; exit 1 on an upward arrow or a cycle
    python3 .ci/layers.py --arrows   # every arrow, with the files that make it

A room is a folder of src/ (src/proxy, src/proxy/session, ...), and a file directly in
src/ other than lib.rs/main.rs is a room of its own. An arrow A -> B means a file of room A
names a path in room B (`use crate::b::...`, `super::...`, or an inline `crate::b::x`).
A folder and its subfolders are one family: arrows inside a family do not count for
layers. LAYERS below is the intended order of the top-level rooms, lowest first (the same
as lib.rs's module doc); an arrow to a room of the same or a later layer points up.
Cycles are found without LAYERS, twice: between rooms, and between modules (files), which
also catches two files of one folder that use each other.
"""

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# Lowest first. Rooms on one line share a layer (neither may use the other).
LAYERS = [
    ["fault", "supervisor", "task", "units"],
    ["resp"],
    ["metrics"],
    ["journal"],
    ["config"],
    ["net"],
    ["upstream"],
    ["valkey"],
    ["commands"],
    ["durability"],
    ["disk"],
    ["checkpoint"],
    ["datadir"],
    ["restore"],
    ["archive"],
    ["replication", "proxy"],
    ["http"],
    ["daemon"],
    ["cli"],
]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_path(f: Path) -> list[str]:
    parts = list(f.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def rooms() -> set[tuple[str, ...]]:
    found = {tuple(d.relative_to(SRC).parts) for d in SRC.rglob("*") if d.is_dir()}
    for f in SRC.glob("*.rs"):
        if f.stem not in ("lib", "main"):
            found.add((f.stem,))
    return found


def room_of(path: list[str], all_rooms) -> tuple[str, ...] | None:
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in all_rooms:
            return tuple(path[:n])
    return None


def strip_comments(text: str) -> str:
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def expand_use_tree(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = tree.strip()
    m = re.match(r"^(.*?)\{(.*)\}$", tree, flags=re.S)
    if not m:
        return [re.sub(r"\s+as\s+\w+$", "", tree).strip()] if tree else []
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += (ch == "{") - (ch == "}")
        cur += ch
    items.append(cur)
    out = []
    for item in items:
        for sub in expand_use_tree(item):
            out.append((prefix + sub) if sub not in ("self", "") else prefix.rstrip(":"))
    return out


def resolve(path: str, here: list[str]) -> list[str] | None:
    parts = [p for p in path.split("::") if p]
    if not parts:
        return None
    if parts[0] == "crate":
        return parts[1:]
    if parts[0] in ("super", "self"):
        base = list(here)
        while parts and parts[0] in ("super", "self"):
            if parts.pop(0) == "super":
                base = base[:-1]
        return base + parts
    return None


def referenced_modules(f: Path, here: list[str]) -> list[list[str]]:
    text = strip_comments(f.read_text())
    paths = []
    for m in re.finditer(r"\buse\s+((?:crate|super|self)\b[^;]*);", text):
        paths += expand_use_tree(m.group(1))
    paths += re.findall(rf"\bcrate(?:::{IDENT})+", text)
    return [t for t in (resolve(p, here) for p in paths) if t]


def arrows():
    """(room arrows with their files, module arrows)."""
    all_rooms = rooms()
    modules = {tuple(module_path(f)) for f in SRC.rglob("*.rs")}
    found: dict[tuple, set[str]] = {}
    module_arrows: set[tuple[str, str]] = set()
    for f in sorted(SRC.rglob("*.rs")):
        here = module_path(f)
        src_room = room_of(here, all_rooms) if here else None
        for target in referenced_modules(f, here):
            # The deepest module the path names (the rest are items in it).
            dst_module = next(
                (tuple(target[:n]) for n in range(len(target), 0, -1) if tuple(target[:n]) in modules),
                None,
            )
            if dst_module and dst_module != tuple(here):
                module_arrows.add(("/".join(here), "/".join(dst_module)))
            dst_room = room_of(target, all_rooms)
            if not src_room or not dst_room or src_room[0] == dst_room[0]:
                continue
            found.setdefault((src_room, dst_room), set()).add(str(f.relative_to(SRC)))
    return found, module_arrows


def top_arrows(found):
    top: dict[tuple[str, str], set[str]] = {}
    for (a, b), files in found.items():
        top.setdefault((a[0], b[0]), set()).update(files)
    return top


def cycles(edges) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    found, module_arrows = arrows()
    top = top_arrows(found)
    layer = {room: i for i, names in enumerate(LAYERS) for room in names}
    unknown = sorted({r for pair in top for r in pair if r not in layer})
    upward = [(a, b) for (a, b) in top if a in layer and b in layer and layer[b] >= layer[a]]
    found_cycles = cycles(top) + cycles(module_arrows)
    if "--arrows" in sys.argv:
        for (a, b), files in sorted(top.items()):
            mark = "  UP" if (a, b) in upward else ""
            print(f"{a} -> {b}{mark}: {', '.join(sorted(files))}")
    print(f"rooms: {len({r for pair in top for r in pair})}, arrows: {len(top)}, "
          f"modules: {len({m for pair in module_arrows for m in pair})}, "
          f"module arrows: {len(module_arrows)}, "
          f"upward: {len(upward)}, cycles: {len(found_cycles)}")
    for a, b in sorted(upward):
        print(f"  up: {a} -> {b} ({', '.join(sorted(top[(a, b)]))})")
    for c in found_cycles:
        print(f"  cycle: {' <-> '.join(c)}")
    for r in unknown:
        print(f"  not in LAYERS: {r}")
    sys.exit(1 if upward or found_cycles or unknown else 0)


if __name__ == "__main__":
    main()
