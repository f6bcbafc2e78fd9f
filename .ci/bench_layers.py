#!/usr/bin/env python3
"""The benchmark tool's shape, checked: among the Python files of deploy/ (the package
deploy/bench/ and the scripts beside it) no import cycle; in the package, no shared module
imports a suite (bench/suites/) or the command (bench/__main__.py); and every entry point
(deploy/bench.py, deploy/bench_shards.py, deploy/soak.py, deploy/hostile_load.py) starts and
answers --help.

    python3 .ci/bench_layers.py      # exit 1 on an upward import, a cycle or an entry point that fails
"""

import ast
import subprocess
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
ENTRY_POINTS = ["bench.py", "bench_shards.py", "soak.py", "hostile_load.py"]


def find(dotted: list[str]) -> Path | None:
    """The file a module path names, searched from deploy/ as Python does (a package before a
    module of the same name)."""
    path = DEPLOY.joinpath(*dotted)
    for f in (path / "__init__.py", path.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def imports(f: Path) -> set[Path]:
    """The files of deploy/ that `f` imports (anywhere in it, functions too)."""
    package = list(f.parent.relative_to(DEPLOY).parts)
    out = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            base += node.module.split(".") if node.module else []
            names = [base] + [base + [a.name] for a in node.names]
        else:
            continue
        out |= {found for found in map(find, names) if found is not None}
    return out - {f}


def cycles(edges: dict[Path, set[Path]]) -> list[list[Path]]:
    found, state = [], {}

    def visit(v, path):
        state[v] = "open"
        for w in sorted(edges[v]):
            if state.get(w) == "open":
                found.append(path[path.index(w):] + [w])
            elif w not in state:
                visit(w, path + [w])
        state[v] = "done"

    for v in sorted(edges):
        if v not in state:
            visit(v, [v])
    return found


def main():
    files = sorted(DEPLOY.glob("*.py")) + sorted((DEPLOY / "bench").rglob("*.py"))
    edges = {f: imports(f) for f in files}
    name = lambda f: str(f.relative_to(DEPLOY))
    shared = lambda f: f.parent == DEPLOY / "bench" and f.name != "__main__.py"
    problems = ["%s imports %s" % (name(f), ", ".join(name(d) for d in sorted(deps) if not shared(d)))
                for f, deps in edges.items() if shared(f) and any(not shared(d) for d in deps)]
    problems += ["cycle: " + " -> ".join(map(name, c)) for c in cycles(edges)]
    for entry in ENTRY_POINTS:
        run = subprocess.run([sys.executable, str(DEPLOY / entry), "--help"], capture_output=True, text=True)
        if run.returncode != 0 or "usage:" not in run.stdout:
            problems.append("%s --help: exit %d\n%s" % (entry, run.returncode, run.stderr[-2000:]))
    for p in problems:
        print(p)
    print("deploy: %d Python files, %d imports between them, %d problems"
          % (len(edges), sum(map(len, edges.values())), len(problems)))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
