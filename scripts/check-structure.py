#!/usr/bin/env python3
"""The workspace's shape, checked: what the shipped binary links, import circles
inside each crate, structs whose fields are visible outside their module, and
scripts longer than LONG lines.

    scripts/check-structure.py            print the shape; fail if it got worse
    scripts/check-structure.py --update   write the current shape as the bound

Import circles: a module "uses" another when its file names it (a `use` or a path:
`crate::a::b`, `super::x`, `self::x`, or a child module's name); declaring a child
module (`mod x;`) is ownership, not use. A circle is a strongly connected set of
such modules. A re-export (`pub use`) is a facade, not a use. Wide structs: named-field
structs with more than WIDE fields marked `pub`, `pub(crate)` or `pub(super)`, records
left out: data whose fields are the point, with no state between them to keep right:
zerocopy layouts, serde documents and clap arguments (by their derives); tallies (every
field an integer or an atomic integer: each counts one thing on its own); symbol
tables (every field but a name and version an `extern "C" fn` loaded from a library);
and option records (a `pub struct` whose fields are all `pub` and that implements
Default: what a caller fills in with `..Default::default()`).

The bound (scripts/structure-bound.json) only ever comes down: a change that makes a
circle larger, adds one, widens a struct or lengthens a long script fails
`scripts/test.sh`. Issue 51 asks for no circle, no struct over 10 visible fields
and no script over 800 lines; the bound records how far the tree is from that.
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOUND = os.path.join(ROOT, "scripts", "structure-bound.json")
WIDE = 10
# Lines a script (shell or Python, under scripts/) may have.
LONG = 800
# Derives that make a struct a record of data (a wire layout, a serde document, a
# command line) rather than a part that owns state.
RECORD = r"FromBytes|IntoBytes|Immutable|Serialize|Deserialize|clap::Args|\bArgs\b|Parser"
# Crates that are test code: the shipped binary must link none of them.
TEST_CRATES = {"test-util", "test-kit", "test-servers", "nvme-fuzz"}


def strip(src):
    """Source without comments, strings and char literals (so paths inside them do
    not count), read the way rustc's lexer reads it: one pass, left to right, so a
    string's `//` is not a comment, a comment's quote is not a string, `r"` is a raw
    string only where an identifier does not go on before it ("error" ends in r),
    block comments nest, and `'a` is a lifetime, not the start of a char. A string
    becomes "", a char ' ', a comment a space (its newlines kept, so line numbers
    hold)."""
    out, i, n = [], 0, len(src)

    def ident(c):
        return c.isalnum() or c == "_"

    while i < n:
        c = src[i]
        nxt = src[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = src.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(" " + "\n" * src.count("\n", i, j))
            i = j
        elif c in "rb" and (i == 0 or not ident(src[i - 1])) and (
                m := re.match(r'(?:br|rb|r)(#*)"', src[i:i + 260])):
            # A raw string: r"...", r#"..."#, br"...": no escapes, ends at " and the
            # same number of #.
            close = '"' + m.group(1)
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
        elif c == '"' or (c in "bc" and nxt == '"' and (i == 0 or not ident(src[i - 1]))):
            # A string, a byte string b"..." or a C string c"...": escapes skip a char.
            j = i + (1 if c == '"' else 2)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append('""' + "\n" * src.count("\n", i, min(j, n)))
            i = j
        elif c == "'" or (c == "b" and nxt == "'" and (i == 0 or not ident(src[i - 1]))):
            # A char ('x', '\n', '\u{..}', b'x') or a lifetime ('a, 'static).
            j = i + (1 if c == "'" else 2)
            if j < n and src[j] == "\\":
                k = src.find("'", j + 2)
                out.append("' '")
                i = n if k < 0 else k + 1
            elif j + 1 < n and src[j + 1] == "'":
                out.append("' '")
                i = j + 2
            else:
                out.append("'")
                i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


# What fooled the regular expressions strip() once was: a string ending in r read as
# a raw string's start ("error"), a string's // read as a comment, nested block
# comments, lifetimes read as chars. Checked at every run, so a blind check fails.
STRIP_CASES = [
    ('let e = "error"; use crate::a::B; let f = "x";', ["crate::a::B"], []),
    ('let u = "http://x"; crate::b::f();', ["crate::b::f"], []),
    ('let s = "crate::hidden::X";', [], ["crate::hidden"]),
    ('let r = r#"a "q" b"#; crate::c::g();', ["crate::c::g"], ['"q"']),
    ('/* a /* b */ crate::nested::X */ crate::d::h();', ["crate::d::h"], ["crate::nested"]),
    ("fn f<'a>(x: &'a str) -> char { let q = '\\''; 'x' } crate::e::i();", ["crate::e::i", "'a str"], []),
    ('let b = (b"x\\"y", br"z", b\'"\'); crate::f::j();', ["crate::f::j"], []),
    ('// crate::gone::X\ncrate::g::k();', ["crate::g::k"], ["crate::gone"]),
    ('let t = "two\nlines";\ncrate::h::l();', ["crate::h::l"], []),
]


def strip_self_test():
    """The lexer's cases: what must stay, what must go, line numbers kept."""
    wrong = []
    for src, keep, gone in STRIP_CASES:
        got = strip(src)
        if any(k not in got for k in keep) or any(g in got for g in gone) or got.count("\n") != src.count("\n"):
            wrong.append(f"{src!r} -> {got!r}")
    return wrong


def without_inline_modules(text):
    """The text without `mod name { ... }` blocks (test modules, mostly): paths in
    them are relative to a module this parse does not track."""
    while True:
        m = re.search(r"\bmod\s+\w+\s*\{", text)
        if not m:
            return text
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[:m.start()] + text[i:]


def modules(src_dir):
    """{module path (tuple): file} for every file module under src_dir."""
    out = {}
    for d, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, src_dir)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                mod = ()
            elif rel[-1] == "mod":
                mod = tuple(rel[:-1])
            else:
                mod = tuple(rel)
            if rel[0] == "bin" or mod in out:
                continue
            out[mod] = path
    return out


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand_use(prefix + part)]


def resolve(mod, path, mods, children):
    """The module a path (a list of segments, as written in `mod`) lands in, or None."""
    if not path:
        return None
    if path[0] == "crate":
        base, rest = (), path[1:]
    elif path[0] in ("super", "self"):
        base = mod
        rest = path
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif path[0] in children.get(mod, ()):
        base, rest = mod, path
    else:
        return None
    best = base if base in mods else None
    cur = base
    for seg in rest:
        cur = cur + (seg,)
        if cur in mods:
            best = cur
        else:
            break
    return best


def graph(src_dir):
    mods = modules(src_dir)
    children = {}
    texts = {}
    for mod, path in mods.items():
        texts[mod] = without_inline_modules(strip(open(path, encoding="utf-8").read()))
    for mod, text in texts.items():
        children[mod] = {m.group(1) for m in re.finditer(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text)}
    edges = {m: set() for m in mods}
    for mod, text in texts.items():
        paths = []
        # A re-export (`pub use`, a facade) is not this module using the other.
        facade = re.sub(r"\bpub(?:\([^)]*\))?\s+use\s+[^;]+;", "", text)
        for m in re.finditer(r"\buse\s+([^;]+);", facade):
            paths += expand_use(m.group(1))
        for m in re.finditer(r"(?<![\w:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", facade):
            paths.append(m.group(1))
        for p in paths:
            segs = [s for s in re.split(r"::", p) if s and s != "*"]
            segs = [re.sub(r"\bas\b.*", "", s) for s in segs]
            target = resolve(mod, segs, mods, children)
            if target is not None and target != mod:
                edges[mod].add(target)
    return mods, edges


def circles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

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
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def wide_structs(src_dir, crate):
    out = {}
    for d, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            text = strip(open(os.path.join(d, f), encoding="utf-8").read())
            for m in re.finditer(r"\bstruct\s+(\w+)(?:<[^{;(]*>)?\s*(?:where[^{]*)?\{", text):
                # Records (wire layouts, serde documents, command lines) are data,
                # not owners of state: their fields are the point.
                attrs = text[max(0, m.start() - 400):m.start()].rsplit(";", 1)[-1].rsplit("}", 1)[-1]
                if re.search(RECORD, attrs):
                    continue
                depth, i = 1, m.end()
                while depth and i < len(text):
                    depth += {"{": 1, "}": -1}.get(text[i], 0)
                    i += 1
                body = text[m.end():i - 1]
                visible = len(re.findall(r"(?m)^\s*pub(?:\((?:crate|super)\))?\s+(?:r#)?\w+\s*:", body))
                if visible > WIDE and is_record(m.group(1), body, text):
                    continue
                if visible > WIDE:
                    out[f"{crate}::{m.group(1)}"] = visible
    return out


def field_types(body):
    """The type of every field of a struct body (all, visible or not)."""
    body = re.sub(r"(?m)^\s*#\[[^\]]*\]\s*$", "", body)
    out, depth, cur = [], 0, ""
    for ch in body:
        depth += {"<": 1, "(": 1, "[": 1, ">": -1, ")": -1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    types = []
    for f in out:
        f = f.strip()
        if not f:
            continue
        m = re.match(r"(pub(?:\([^)]*\))?\s+)?(?:r#)?(\w+)\s*:\s*(.*)$", f, re.S)
        if m:
            types.append((bool(m.group(1)) and m.group(1).strip() == "pub", m.group(2), " ".join(m.group(3).split())))
    return types


INTEGER = r"(?:u8|u16|u32|u64|u128|usize|i8|i16|i32|i64|i128|isize|Atomic(?:U|I)(?:8|16|32|64|size))"


def is_record(name, body, text):
    """A tally, a symbol table or an option record (see the module docs)."""
    fields = field_types(body)
    if fields and all(re.fullmatch(INTEGER, t) for _, _, t in fields):
        return True
    fns = [t for _, n, t in fields if n not in ("path", "version")]
    if fns and all(re.match(r'unsafe\s+extern\s+"[^"]*"\s+fn', t) for t in fns):
        return True
    public = re.search(r"\bpub\s+struct\s+" + name + r"\b", text)
    default = re.search(r"impl\s+Default\s+for\s+" + name + r"\b", text) or re.search(
        r"#\[derive\([^)]*\bDefault\b[^)]*\)\]\s*(?:#\[[^\]]*\]\s*)*pub\s+struct\s+" + name + r"\b", text)
    return bool(public and default and fields and all(p for p, _, _ in fields))


def shipped_test_crates():
    tree = subprocess.run(
        ["cargo", "tree", "-p", "vnvme", "-e", "normal", "--prefix", "none", "--locked"],
        cwd=ROOT, capture_output=True, text=True,
    )
    if tree.returncode != 0:
        sys.exit(f"check-structure: cargo tree failed: {tree.stderr.strip()}")
    names = {line.split()[0] for line in tree.stdout.splitlines() if line.strip()}
    return sorted(names & TEST_CRATES)


def long_scripts():
    out = {}
    for d, _, files in os.walk(os.path.join(ROOT, "scripts")):
        for f in files:
            if f.endswith((".sh", ".py")):
                p = os.path.join(d, f)
                n = sum(1 for _ in open(p, encoding="utf-8"))
                if n > LONG:
                    out[os.path.relpath(p, ROOT)] = n
    return out


def shape():
    crates_dir = os.path.join(ROOT, "crates")
    result = {"circles": {}, "wide_structs": {}, "long_scripts": long_scripts()}
    report = []
    for crate in sorted(os.listdir(crates_dir)):
        src = os.path.join(crates_dir, crate, "src")
        if not os.path.isdir(src):
            continue
        mods, edges = graph(src)
        found = circles(edges)
        largest = max((len(c) for c in found), default=0)
        # Issue 26: a crate of at most 3 files may keep one.
        if len(mods) > 3:
            result["circles"][crate] = sum(len(c) for c in found)
        for c in found:
            names = ", ".join("::".join(m) or "(root)" for m in c)
            report.append(f"  {crate}: a circle of {len(c)} modules: {names}")
        if not found:
            report.append(f"  {crate}: {len(mods)} modules, no import circle")
        elif largest:
            pass
        result["wide_structs"].update(wide_structs(src, crate))
    return result, report


def main():
    update = "--update" in sys.argv[1:]
    failed = []
    wrong = strip_self_test()
    print("lexer (strings, raw strings, nested comments, lifetimes): " + (
        "wrong on " + "; ".join(wrong) if wrong else f"{len(STRIP_CASES)} cases right"))
    if wrong:
        failed.append("the lexer reads its own test cases wrong: the check would be blind")
    linked = shipped_test_crates()
    print("shipped binary (vnvme, normal dependencies): " + (
        "links test crates: " + ", ".join(linked) if linked else "links no test crate"))
    if linked:
        failed.append("the shipped binary links " + ", ".join(linked))
    cur, report = shape()
    print("import circles (modules in circles, per crate of more than 3 files):")
    print("\n".join(report))
    print(f"structs with more than {WIDE} fields visible outside their module (records left out):")
    for name, n in sorted(cur["wide_structs"].items(), key=lambda kv: -kv[1]):
        print(f"  {name}: {n}")
    if not cur["wide_structs"]:
        print("  none")
    print(f"scripts over {LONG} lines:")
    for name, n in sorted(cur["long_scripts"].items(), key=lambda kv: -kv[1]):
        print(f"  {name}: {n}")
    if not cur["long_scripts"]:
        print("  none")
    if update:
        with open(BOUND, "w", encoding="utf-8") as f:
            json.dump(cur, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"bound written: {os.path.relpath(BOUND, ROOT)}")
    else:
        bound = json.load(open(BOUND, encoding="utf-8"))
        for crate, n in cur["circles"].items():
            b = bound["circles"].get(crate, 0)
            if n > b:
                failed.append(f"{crate}: {n} modules in import circles, the bound is {b}")
        for name, n in cur["wide_structs"].items():
            b = bound["wide_structs"].get(name, WIDE)
            if n > b:
                failed.append(f"{name}: {n} visible fields, the bound is {b}")
        for name, n in cur["long_scripts"].items():
            b = bound.get("long_scripts", {}).get(name, LONG)
            if n > b:
                failed.append(f"{name}: {n} lines, the bound is {b}")
        total = sum(cur["circles"].values())
        btotal = sum(bound["circles"].values())
        better = lambda k: sum(cur[k].values()) < sum(bound.get(k, {}).values())
        if total < btotal or better("wide_structs") or better("long_scripts"):
            print("the shape is better than its bound: lower it with scripts/check-structure.py --update")
    for f in failed:
        print(f"check-structure: {f}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
