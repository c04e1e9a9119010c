#!/usr/bin/env python3
"""include_graph.py - the dependency graph of the files of src/, and its circles.

Nodes are the .c and .h files of src/ and of the folders under it.  File
A depends on file B (an edge A -> B) when A

  - includes B (#include "...", looked up beside A, then in src/), or
  - calls a function that B defines: a definition "name(...) {" at file
    scope in B, and "name(" inside a body in A, which does not define a
    function of that name itself (a static function is its file's own).

A header's inline functions that call into the .c file of the same name
(rsec.h into rsec.c) are that module's inside: no edge.

The scanner is regular expressions over the text with comments, string
and character literals removed: enough for this tree's style, not a C
parser.  A call through a function pointer is no edge (an interface's
implementation is reached through its table, which is the point).

Prints the strongly connected components of more than one file (the
circles) and exits 1 if there is one, 0 otherwise.  --dot prints the
graph in Graphviz's language instead (exit status as above).

  scripts/include_graph.py [--dot] [--src DIR]
"""

import argparse
import os
import re
import sys

KEYWORDS = {
    "if", "for", "while", "switch", "return", "sizeof", "do", "else", "case",
    "goto", "_Alignof", "__alignof__", "alignof", "_Static_assert", "defined",
    "__attribute__", "typeof", "__typeof__", "_Generic", "offsetof",
}


def strip(text):
    """The text with comments, string and character literals blanked out
    (newlines kept, so that line structure stays)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * max(0, j - i - 2) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
CALL_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
PREPROC_RE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)


def definitions(code):
    """Names of the functions defined at file scope in `code` (stripped,
    preprocessor lines removed): an identifier, its parenthesized
    parameters, maybe attributes, then the opening brace at depth 0."""
    names = set()
    depth = 0
    last_close = -1  # position of the ")" that closed the last depth-0 parenthesis group
    paren = 0
    for m in re.finditer(r"[{}()]", code):
        ch = m.group()
        if ch == "(":
            paren += 1
        elif ch == ")":
            paren -= 1
            if depth == 0 and paren == 0:
                last_close = m.start()
        elif ch == "{":
            if depth == 0 and paren == 0:
                between = code[last_close + 1:m.start()] if last_close >= 0 else "x"
                # Only attributes (already balanced) or nothing between ")" and "{".
                if last_close >= 0 and re.fullmatch(r"\s*", between):
                    name = function_name(code, last_close)
                    if name:
                        names.add(name)
            if paren == 0:
                depth += 1
        elif ch == "}":
            if paren == 0:
                depth -= 1
    return names


def function_name(code, close):
    """The name before the parameter list that ends at `close` (skipping
    trailing __attribute__((...)) groups), or None for what is no function
    definition (an initializer, a struct)."""
    # Walk back to the matching "(" of the group ending at close.
    while True:
        level = 0
        i = close
        while i >= 0:
            if code[i] == ")":
                level += 1
            elif code[i] == "(":
                level -= 1
                if level == 0:
                    break
            i -= 1
        if i < 0:
            return None
        head = code[:i].rstrip()
        m = re.search(r"([A-Za-z_]\w*)$", head)
        if not m:
            return None
        name = m.group(1)
        if name in ("__attribute__", "__attribute"):
            # An attribute after the parameters: the parameters end before it.
            close = len(head[: m.start()].rstrip()) - 1
            if close < 0 or code[close] != ")":
                return None
            continue
        if name in KEYWORDS:
            return None
        # "= (...) {" or "struct x (...) {" is no definition.
        before = head[: m.start()].rstrip()
        if before.endswith("=") or before.endswith(","):
            return None
        return name


def bodies(code):
    """The parts of `code` inside braces (function bodies, initializers,
    struct members): where a call can be.  A name followed by "(" at file
    scope is a declaration or a definition, no call."""
    out, depth, start = [], 0, 0
    for m in re.finditer(r"[{}]", code):
        if m.group() == "{":
            if depth == 0:
                start = m.end()
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                out.append(code[start:m.start()])
    return "\n".join(out)


def module_of(rel):
    """The node of a file: the file itself."""
    return rel


def scan(src):
    files = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for f in sorted(filenames):
            if f.endswith((".c", ".h")):
                files.append(os.path.relpath(os.path.join(dirpath, f), src))
    texts = {}
    for rel in files:
        with open(os.path.join(src, rel), encoding="utf-8", errors="replace") as fh:
            texts[rel] = fh.read()
    modules = {}
    for rel in files:
        modules.setdefault(module_of(rel), []).append(rel)
    # The name shown for a node (a node is one file: module_of() is the identity).
    shown = {}
    for mod, members in modules.items():
        cs = [m for m in members if m.endswith(".c")]
        shown[mod] = cs[0] if cs else members[0]
    defs = {}  # function name -> modules that define it
    file_defs = {}
    code_of = {}
    for rel in files:
        code = strip(texts[rel])
        code_of[rel] = code
        nopre = PREPROC_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), code)
        file_defs[rel] = definitions(nopre)
        for name in file_defs[rel]:
            defs.setdefault(name, set()).add(module_of(rel))
    edges = {mod: set() for mod in modules}
    why = {}
    for rel in files:
        mod = module_of(rel)
        here = os.path.dirname(rel)
        for inc in INCLUDE_RE.findall(texts[rel]):
            for cand in (os.path.normpath(os.path.join(here, inc)), os.path.normpath(inc)):
                if cand in texts:
                    if module_of(cand) != mod:
                        edges[mod].add(module_of(cand))
                        why.setdefault((mod, module_of(cand)), []).append("#include \"%s\"" % inc)
                    break
        nopre = PREPROC_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), code_of[rel])
        own = set()
        for member in modules[mod]:
            own |= file_defs[member]
        for name in sorted(set(CALL_RE.findall(bodies(nopre)))):
            if name in own or name in KEYWORDS:
                continue
            for target in defs.get(name, ()):
                if target != mod and not (mod.endswith(".h") and
                                          os.path.splitext(mod)[0] + ".c" == target):
                    edges[mod].add(target)
                    why.setdefault((mod, target), []).append("%s()" % name)
    return modules, shown, edges, {k: ", ".join(v) for k, v in why.items()}


def sccs(nodes, edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
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
                out.append(sorted(comp))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dot", action="store_true", help="print the graph in Graphviz's language")
    ap.add_argument("--src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "src"),
                    help="the source folder (default: src/ of this tree)")
    args = ap.parse_args()
    if not os.path.isdir(args.src):
        print("include_graph.py: %s is not a directory" % args.src, file=sys.stderr)
        return 2
    modules, shown, edges, why = scan(args.src)
    circles = [c for c in sccs(modules.keys(), edges) if len(c) > 1]
    if args.dot:
        in_circle = {m for c in circles for m in c}
        print("digraph src {")
        print("  rankdir=LR; node [shape=box, fontsize=10];")
        for mod in sorted(modules):
            attr = ", color=red" if mod in in_circle else ""
            print('  "%s" [label="%s"%s];' % (mod, shown[mod], attr))
        for a in sorted(edges):
            for b in sorted(edges[a]):
                red = a in in_circle and b in in_circle and any(a in c and b in c for c in circles)
                print('  "%s" -> "%s" [tooltip="%s"%s];' % (a, b, why[(a, b)],
                                                           ", color=red" if red else ""))
        print("}")
    else:
        for c in circles:
            print("circle: %s" % ", ".join(shown[m] for m in c))
            for a in c:
                for b in sorted(edges[a]):
                    if b in c:
                        print("  %s -> %s (%s)" % (shown[a], shown[b], why[(a, b)]))
        if not circles:
            print("no circle among the %d files of %s" % (len(modules),
                                                           os.path.normpath(args.src)))
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
