#!/usr/bin/env python3
"""No public function of src/ returns `Result<_, String>`: each folder has its error type
(lib.rs lists them), and a private helper may build a message that the public function wraps.

    python3 .ci/string_errors.py               # exit 1 and list each one found
    python3 .ci/string_errors.py --src DIR     # check another tree

Public: `pub`, `pub(crate)`, `pub(super)`, `pub(in ..)`. Files are lexed as layers.py lexes
them, so a signature over several lines is one, and comments and strings neither hide nor
fake one.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from layers import lex  # noqa: E402

QUALIFIERS = {"const", "async", "unsafe", "extern", "default"}


def close_of(toks, i, open_c, close_c):
    """The index of the token closing the bracket at toks[i]."""
    depth = 0
    for j in range(i, len(toks)):
        depth += (toks[j] == ("p", open_c)) - (toks[j] == ("p", close_c))
        if depth == 0:
            return j
    return len(toks) - 1


def string_errors(text: str):
    """(name, return type) of each public fn in `text` returning `Result<_, String>`."""
    toks = lex(text)
    found = []
    for i, t in enumerate(toks):
        if t != ("id", "pub"):
            continue
        j = i + 1
        if toks[j:j + 1] == [("p", "(")]:
            j = close_of(toks, j, "(", ")") + 1
        while j < len(toks) and (toks[j][1] in QUALIFIERS or toks[j][0] == "str"):
            j += 1
        if toks[j:j + 1] != [("id", "fn")]:
            continue
        name = toks[j + 1][1]
        k = j + 2
        if toks[k] == ("p", "<"):
            depth = 0
            while True:
                depth += (toks[k] == ("p", "<")) - (toks[k] == ("p", ">"))
                k += 1
                if depth == 0:
                    break
        k = close_of(toks, k, "(", ")") + 1
        if toks[k:k + 2] != [("p", "-"), ("p", ">")]:
            continue
        ret, k = [], k + 2
        while k < len(toks) and toks[k] not in (("p", "{"), ("p", ";"), ("id", "where")):
            ret.append(toks[k][1])
            k += 1
        ret = "".join(ret).replace(",>", ">")
        if "Result<" in ret and ret.endswith(",String>"):
            found.append((name, ret))
    return found


def main():
    args = sys.argv[1:]
    src = Path(args[args.index("--src") + 1]) if "--src" in args else Path(__file__).parent.parent / "src"
    bad = [
        f"{f.relative_to(src)}: fn {name} -> {ret}"
        for f in sorted(src.rglob("*.rs"))
        for name, ret in string_errors(f.read_text())
    ]
    for line in bad:
        print(line)
    print(f"{len(bad)} public functions return Result<_, String>")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
