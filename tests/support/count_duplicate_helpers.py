"""Count top-level function/class names (not test_*/Test*) defined in more than one tests/**/*.py module.

Usage: python tests/support/count_duplicate_helpers.py [tests] [-v]   (issue 27: the before/after figure)."""
import ast
import sys
from collections import defaultdict
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests")
defs = defaultdict(set)
for p in sorted(root.rglob("*.py")):
    tree = ast.parse(p.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name.startswith("test_") or node.name.startswith("Test"):
                continue
            defs[node.name].add(str(p))
dups = {n: s for n, s in defs.items() if len(s) > 1}
verbose = "-v" in sys.argv
for n in sorted(dups, key=lambda n: -len(dups[n])):
    print(f"{len(dups[n]):3d} {n}" + (f"  {sorted(dups[n])}" if verbose else ""))
print(f"names defined in more than one module: {len(dups)}")
