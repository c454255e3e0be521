"""No long functions in hwgen/: none over 150 lines, at most 5 over 100 (issue 29 item 7).

A function's length is ``end_lineno - lineno + 1`` of its ``def`` node (decorators excluded,
docstring included). Long ``elaborate`` methods are split into stage methods or components,
long functions into helpers. Parses the sources only: imports nothing of hwgen.
"""

import ast
from pathlib import Path

HWGEN = Path(__file__).resolve().parent.parent / "hwgen"

#: No function may be longer than this.
MAX_LINES = 150
#: At most ``MAX_LONG`` functions may be longer than ``LONG_LINES``.
LONG_LINES = 100
MAX_LONG = 5


def function_lengths(root=HWGEN):
    """``(length, "file:line", qualified name)`` of every function under ``root``."""
    rows = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        stack = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        length = child.end_lineno - child.lineno + 1
                        where = f"{path.relative_to(root.parent)}:{child.lineno}"
                        rows.append((length, where, name))
                    stack.append((child, f"{name}."))
                else:
                    stack.append((child, prefix))
    return rows


def _listing(rows):
    return "\n".join(f"  {where} {name} {length}" for length, where, name in
                     sorted(rows, reverse=True))


def test_function_lengths_are_counted():
    rows = function_lengths()
    assert len(rows) > 1000
    assert all(length >= 1 for length, _, _ in rows)


def test_no_function_over_150_lines():
    over = [r for r in function_lengths() if r[0] > MAX_LINES]
    assert not over, f"functions over {MAX_LINES} lines (split them):\n" + _listing(over)


def test_at_most_5_functions_over_100_lines():
    long = [r for r in function_lengths() if r[0] > LONG_LINES]
    assert len(long) <= MAX_LONG, (
        f"{len(long)} functions over {LONG_LINES} lines, at most {MAX_LONG} allowed:\n"
        + _listing(long))
