"""What the source-reading tests (test_messages.py, test_byte_units.py) share."""

from __future__ import annotations

import ast


def docstring_ids(tree: ast.AST) -> set[int]:
    """The ``id`` of every docstring's constant in ``tree`` (a module's, a class's, a
    function's): text for readers of the code, not for users."""
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, kinds)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
