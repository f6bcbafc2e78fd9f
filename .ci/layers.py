#!/usr/bin/env python3
"""Which module folder (room) of src/ uses which, whether any use points up, and whether
any two files or folders use each other.

    python3 .ci/layers.py                  # summary; exit 1 on an upward arrow or a cycle
    python3 .ci/layers.py --arrows         # every arrow between rooms, with its files
    python3 .ci/layers.py --modules        # every arrow between files
    python3 .ci/layers.py --src DIR        # check another tree (the tests plant faults in one)

What counts as a use. The crate's module tree is read the way rustc reads it: from lib.rs
through every `mod x;` (with `#[path]`) and inline `mod x { .. }`. Each file is lexed, so
comments (doc comments included) and string and char literals can neither hide nor fake a
path. Every path is resolved to the module that defines what it names:
- `use` declarations, grouped and nested, with `self`, `super`, `crate`, `as` and `*`;
  private and `pub use` alike;
- inline paths anywhere in code: `crate::a::b`, `super::a::b` (`super` counted from the
  module the path is written in, inline `mod tests { .. }` included), `self::a`, and paths
  that start with a child module or with a name a `use` brought in; a path written as a
  string in an attribute (`deserialize_with = "crate::units::size"`), but for `doc`;
- a path makes an arrow to the module it names and, through re-exports (`pub use x::Item`,
  a glob `pub use x::*`, or a private `use` a child module sees), to the module that
  defines the item: the code needs both.
main.rs is a separate crate (it names `walrus::`, never `crate::`) and is not read. What no
path shows is not seen: a method called on a value whose type another file defines.

Layers. A room is a top-level module: a folder of src/ or a file directly in it (other
than lib.rs/main.rs). LAYERS below is their intended order, lowest first (the same as
lib.rs's module doc); an arrow from a file of room A to what room B defines or names points
up when B is of A's layer or a later one.

Cycles, found without LAYERS. An arrow between two files is seen from the deepest folder
holding both: there it joins two of that folder's entries (its files, and its subfolders
each taken whole), and no two entries of one folder may reach each other. A folder's own
mod.rs (lib.rs for src/) is the folder's face, not an entry: it declares what is under it
and holds what they share, so arrows between it and the files under it are no cycle. A
file's own submodule files (tests kept in a file of their own) count as that file.
"""

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

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

IDENT = re.compile(r"r#([A-Za-z_][A-Za-z0-9_]*)|([A-Za-z_][A-Za-z0-9_]*)")
RAW_STRING = re.compile(r'[bc]?r(#*)"')
STRING = re.compile(r'[bc]?"')
NUMBER = re.compile(r"[0-9][0-9A-Za-z_]*(?:\.[0-9][0-9A-Za-z_]*)?")
PATH_STRING = re.compile(r"(crate|super|self)(::[A-Za-z_][A-Za-z0-9_]*)+$")
ITEM_KEYWORDS = {"fn", "struct", "enum", "trait", "type", "const", "static", "union"}
KEYWORDS = ITEM_KEYWORDS | {"mod", "use", "pub", "impl", "let", "mut", "unsafe", "async", "extern"}


def lex(text: str) -> list[tuple[str, str]]:
    """(kind, text) tokens: "id" identifiers, "str" string literals (their raw body, for
    `#[path]`), "p" punctuation (`::` is one). Comments, chars, lifetimes and numbers are
    dropped: nothing in them is a path."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth = 0
            while i < n:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                    if depth == 0:
                        break
                else:
                    i += 1
        elif m := RAW_STRING.match(text, i):
            close = '"' + m.group(1)
            j = text.find(close, m.end())
            j = n if j < 0 else j
            out.append(("str", text[m.end():j]))
            i = j + len(close)
        elif m := STRING.match(text, i):
            j = m.end()
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(("str", text[m.end():j]))
            i = j + 1
        elif c == "'" or text.startswith("b'", i):
            k = i + (1 if c == "'" else 2)
            if k < n and text[k] == "\\":  # '\n', '\'', '\u{..}'
                j = text.find("'", k + 2)
                i = n if j < 0 else j + 1
            elif k + 1 < n and text[k + 1] == "'":  # 'x'
                i = k + 2
            else:  # a lifetime or a label
                m = IDENT.match(text, k)
                i = m.end() if m else k
        elif m := IDENT.match(text, i):
            out.append(("id", m.group(1) or m.group(2)))
            i = m.end()
        elif m := NUMBER.match(text, i):
            i = m.end()
        elif text.startswith("::", i):
            out.append(("p", "::"))
            i += 2
        else:
            out.append(("p", c))
            i += 1
    return out


@dataclass
class Module:
    path: tuple[str, ...]
    file: Path
    file_module: tuple[str, ...]  # the module the file itself is (self, for a file's root)
    is_dir: bool = False  # a folder's face: its mod.rs, lib.rs, or foo.rs beside foo/
    children: set[str] = field(default_factory=set)
    items: set[str] = field(default_factory=set)  # defined at the module's top level
    bindings: dict[str, list[str]] = field(default_factory=dict)  # name -> path, any `use`
    exports: dict[str, list[str]] = field(default_factory=dict)  # top-level `use`s only
    globs: list[list[str]] = field(default_factory=list)  # top-level `use x::*`
    refs: list[list[str]] = field(default_factory=list)  # every path written in it


def use_leaves(toks, i, prefix):
    """Parses one use tree at toks[i]: ([(path, bound name or None, is_glob)], next i)."""
    segs = list(prefix)
    if toks[i] == ("p", "::"):
        segs, i = ["::"], i + 1
    while True:
        kind, text = toks[i]
        if kind == "id":
            i += 1
            if toks[i] == ("p", "::"):
                segs.append(text)
                i += 1
                continue
            path, bound = (segs, segs[-1] if segs else None) if text == "self" else (segs + [text], text)
            if toks[i] == ("id", "as"):
                bound = None if toks[i + 1][1] == "_" else toks[i + 1][1]
                i += 2
            return [(path, bound, False)], i
        if text == "*":
            return [(segs, None, True)], i + 1
        if text == "{":
            leaves, i = [], i + 1
            while toks[i] != ("p", "}"):
                sub, i = use_leaves(toks, i, segs)
                leaves += sub
                if toks[i] == ("p", ","):
                    i += 1
            return leaves, i + 1
        raise SyntaxError(f"unexpected {text!r} in a use tree")


def attribute_strings(toks) -> set[int]:
    """Where the string literals inside attributes are, but for `#[doc = ".."]`: a path
    written as a string there is code (serde's `deserialize_with = "crate::units::size"`)."""
    found, i = set(), 0
    while i < len(toks):
        start = i + 2 if toks[i + 1:i + 2] == [("p", "!")] else i + 1
        if toks[i] == ("p", "#") and toks[start:start + 1] == [("p", "[")]:
            depth, j = 0, start
            while j < len(toks):
                depth += (toks[j] == ("p", "[")) - (toks[j] == ("p", "]"))
                if depth == 0:
                    break
                j += 1
            if toks[start + 1:start + 2] != [("id", "doc")]:
                found.update(k for k in range(start, j) if toks[k][0] == "str")
            i = j
        i += 1
    return found


def read_file(f: Path, file_module: tuple, modules: dict, is_dir: bool) -> list:
    """Records the file's modules (its own and inline ones) into `modules`; returns its
    out-of-line `mod x;` declarations as (module path, child file candidates, whether the
    child's file is in the folder named after this file)."""
    toks = lex(f.read_text()) + [("p", ";")] * 4
    frames = [(file_module, 0)]  # (inline module, brace depth of its body)
    modules[file_module] = Module(file_module, f, file_module, is_dir)
    here_dir = f.parent if is_dir else f.parent / f.stem
    in_attribute = attribute_strings(toks)
    decls, depth, path_attr, i = [], 0, None, 0
    while i < len(toks) - 4:
        kind, text = toks[i]
        scope, scope_depth = frames[-1]
        mod = modules[scope]
        top = depth == scope_depth
        if [t if k != "str" else "" for k, t in toks[i:i + 6]] == ["#", "[", "path", "=", "", "]"]:
            path_attr = toks[i + 4][1]
            i += 6
        elif kind == "str":
            if i in in_attribute and PATH_STRING.match(text):
                mod.refs.append(text.split("::"))
            i += 1
        elif (kind, text) == ("id", "mod") and toks[i + 1][0] == "id":
            name = toks[i + 1][1]
            if top:
                mod.children.add(name)
            if toks[i + 2] == ("p", "{"):
                frames.append((scope + (name,), depth + 1))
                modules[scope + (name,)] = Module(scope + (name,), f, file_module)
                depth += 1
                i += 3
            else:
                inline = list(scope[len(file_module):])
                if path_attr:
                    files = [(f.parent / path_attr).resolve()]
                else:
                    d = here_dir.joinpath(*inline)
                    files = [d / f"{name}.rs", d / name / "mod.rs"]
                decls.append((scope + (name,), files, path_attr is None and scope == file_module))
                i += 2
            path_attr = None
        elif (kind, text) == ("id", "use") and (toks[i + 1][0] == "id" or toks[i + 1][1] in ("::", "{")):
            try:
                leaves, i = use_leaves(toks, i + 1, [])
            except (SyntaxError, IndexError) as e:
                raise SystemExit(f"{f}: a `use` this check cannot read ({e})")
            for path, bound, glob in leaves:
                mod.refs.append(path)
                if glob and top:
                    mod.globs.append(path)
                elif bound:
                    mod.bindings[bound] = path
                    if top:
                        mod.exports[bound] = path
        elif kind == "id" and text in ITEM_KEYWORDS and toks[i + 1][0] == "id" and toks[i + 1][1] not in KEYWORDS:
            if top:
                mod.items.add(toks[i + 1][1])
            i += 1
        elif (kind, text) == ("id", "macro_rules") and toks[i + 1] == ("p", "!"):
            if top:
                mod.items.add(toks[i + 2][1])
            i += 3
        elif kind == "id" and toks[i + 1] == ("p", "::") and toks[i - 1] != ("p", "::"):
            # `pub(in crate::x)` restricts visibility: it names no dependency.
            in_visibility = toks[i - 2:i] == [("p", "("), ("id", "in")]
            segs = [text]
            while toks[i + 1] == ("p", "::") and toks[i + 2][0] == "id":
                segs.append(toks[i + 2][1])
                i += 2
            if not in_visibility:
                mod.refs.append(segs)
            i += 1
        else:
            if text in ("{", "}", ";"):
                path_attr = None
            if text == "{":
                depth += 1
            elif text == "}":
                if len(frames) > 1 and depth == frames[-1][1]:
                    frames.pop()
                depth -= 1
            i += 1
    return decls


def crate_modules(src: Path) -> tuple[dict, list[Path]]:
    """Every module reachable from lib.rs, and the .rs files under src/ none of them is."""
    modules: dict[tuple, Module] = {}
    seen: set[Path] = set()
    queue = [((), src / "lib.rs")]
    while queue:
        path, f = queue.pop()
        seen.add(f.resolve())
        is_dir = f.name in ("mod.rs", "lib.rs")
        for child, files, in_folder in read_file(f, path, modules, is_dir):
            found = next((c for c in files if c.exists()), None)
            if found is None:
                raise SystemExit(f"{f}: no file for `mod {child[-1]}` ({', '.join(map(str, files))})")
            modules[path].is_dir |= in_folder
            queue.append((child, found))
    stray = [f for f in sorted(src.rglob("*.rs")) if f.resolve() not in seen and f.name != "main.rs"]
    return modules, stray


def resolve(segs: list[str], scope: tuple, modules: dict, guard: int = 0) -> list[str] | None:
    """The absolute crate path a path written in module `scope` names, or None when it is
    outside the crate (std, a dependency) or a local name (a type, a variant)."""
    if not segs or guard > 16:
        return None
    segs = list(segs)
    first, rest, mod = segs[0], segs[1:], modules[scope]
    if first == "crate":
        return rest
    if first in ("self", "super"):
        base = list(scope)
        while segs and segs[0] in ("self", "super"):
            if segs.pop(0) == "super":
                base = base[:-1]
        return base + segs
    if first in mod.children:
        return list(scope) + segs
    if first in mod.bindings and mod.bindings[first] != segs:
        base = resolve(mod.bindings[first], scope, modules, guard + 1)
        return None if base is None else base + rest
    return None


def named_module(path: list[str], modules: dict) -> tuple:
    """The deepest module an absolute path names (the rest are items in it)."""
    return next(tuple(path[:n]) for n in range(len(path), -1, -1) if tuple(path[:n]) in modules)


def defining_module(path: list[str], modules: dict, guard: int = 0) -> tuple:
    """The module that defines what an absolute path names, through re-exports."""
    mod = modules[named_module(path, modules)]
    rest = path[len(mod.path):]
    if rest and rest[0] not in mod.items and guard < 16:
        name = rest[0]
        targets = [mod.exports[name]] if name in mod.exports else []
        for g in mod.globs:
            source = resolve(g, mod.path, modules)
            m = modules.get(tuple(source)) if source is not None else None
            if m and (name in m.items or name in m.exports or name in m.children):
                targets.append(g + [name])
        for t in targets:
            absolute = resolve(list(t), mod.path, modules)
            if absolute is not None:
                return defining_module(absolute + rest[1:], modules, guard + 1)
    return mod.path


def node_of(path: tuple, modules: dict) -> tuple:
    """The file a module counts as: itself, or for a file's own submodules (its tests in
    another file, inline modules) the file they belong to."""
    while path and not modules[path[:-1]].is_dir:
        path = path[:-1]
    return path


def show(node: tuple, modules: dict) -> str:
    return "/".join(node) + ("/" if modules[node].is_dir else ".rs") if node else "lib.rs"


def arrows(src: Path):
    """(modules, file arrows, sibling arrows, stray files); each arrow maps to the paths
    that make it.
    A file arrow is one file naming what another defines. A sibling arrow is a file arrow
    seen from the deepest folder holding both ends: between two of its files or subfolders.
    An arrow to or from a folder's own mod.rs (the folder's face: it declares the files
    under it and holds what they share) makes no sibling arrow."""
    modules, stray = crate_modules(src)
    file_arrows: dict[tuple, set[str]] = {}
    for mod in modules.values():
        here = node_of(mod.file_module, modules)
        for ref in mod.refs:
            absolute = resolve(list(ref), mod.path, modules)
            if absolute is None:
                continue
            for target in {named_module(absolute, modules), defining_module(absolute, modules)}:
                there = node_of(modules[target].file_module, modules)
                if there != here:
                    file_arrows.setdefault((here, there), set()).add("::".join(ref))
    siblings: dict[tuple, set[str]] = {}
    for (a, b), files in file_arrows.items():
        n = next(n for n in range(min(len(a), len(b)) + 1) if n == min(len(a), len(b)) or a[n] != b[n])
        if n < len(a) and n < len(b):
            siblings.setdefault((a[:n + 1], b[:n + 1]), set()).update(files)
    return modules, file_arrows, siblings, stray


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
        for w in sorted(graph[v]):
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
    args = sys.argv[1:]
    src = Path(args[args.index("--src") + 1]) if "--src" in args else Path(__file__).resolve().parent.parent / "src"
    modules, file_arrows, siblings, stray = arrows(src)
    top = {(a[0], b[0]): {show(x, modules) for (x, y) in file_arrows if x[:1] == a and y[:1] == b}
           for (a, b) in siblings if len(a) == 1}
    layer = {room: i for i, names in enumerate(LAYERS) for room in names}
    unknown = sorted({r for pair in top for r in pair if r not in layer})
    upward = sorted((a, b) for (a, b) in top if a in layer and b in layer and layer[b] >= layer[a])
    found_cycles = cycles(siblings)
    if "--arrows" in args:
        for (a, b), files in sorted(top.items()):
            mark = "  UP" if (a, b) in upward else ""
            print(f"{a} -> {b}{mark}: {', '.join(sorted(files))}")
    if "--modules" in args:
        for (a, b), files in sorted(file_arrows.items()):
            print(f"{show(a, modules)} -> {show(b, modules)}")
    print(f"rooms: {len({r for pair in top for r in pair})}, arrows: {len(top)}, "
          f"files: {len({m for pair in file_arrows for m in pair})}, "
          f"file arrows: {len(file_arrows)}, "
          f"upward: {len(upward)}, cycles: {len(found_cycles)}")
    for a, b in upward:
        print(f"  up: {a} -> {b} ({', '.join(sorted(top[(a, b)]))})")
    for c in found_cycles:
        print(f"  cycle: {' <-> '.join(show(n, modules) for n in c)}")
        for (a, b), paths in sorted(siblings.items()):
            if a in c and b in c:
                named = sorted(paths)
                more = f", ... ({len(named)} paths)" if len(named) > 3 else ""
                print(f"    {show(a, modules)} -> {show(b, modules)}: {', '.join(named[:3])}{more}")
    for r in unknown:
        print(f"  not in LAYERS: {r}")
    for f in stray:
        print(f"  not in the module tree: {f.relative_to(src)}")
    sys.exit(1 if upward or found_cycles or unknown or stray else 0)


if __name__ == "__main__":
    main()
