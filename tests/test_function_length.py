"""No function in zerokit/ is longer than MAX_FUNCTION_LINES: a longer one is split into named helpers."""

import ast
from pathlib import Path

import zerokit

MAX_FUNCTION_LINES = 150  # from the `def` line to the last line of its body (decorators not counted)
PACKAGE = Path(zerokit.__file__).resolve().parent


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, str, int]]:
    """(path relative to root's parent, qualified name, lines) of every function or method under root over limit."""
    found = []

    def visit(node: ast.AST, path: str, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{scope}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1
                    if length > limit:
                        found.append((path, name, length))
                visit(child, path, name + ".")
            else:
                visit(child, path, scope)

    for file in sorted(root.rglob("*.py")):
        path = file.relative_to(root.parent).as_posix()
        visit(ast.parse(file.read_text(encoding="utf-8"), filename=str(file)), path, "")
    return found


def test_no_function_over_the_limit():
    too_long = long_functions(PACKAGE)
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named helpers):\n" + "\n".join(
        f"  {path}: {name} is {length} lines" for path, name, length in too_long)


def test_the_check_finds_a_long_function(tmp_path):
    """The walk sees methods in subpackages and counts from `def` to the last line: 150 lines pass, 151 do not."""
    statements = [f"x{i} = {i}" for i in range(MAX_FUNCTION_LINES)]
    fits = "def fits():\n" + "".join(f"    {s}\n" for s in statements[:-1])
    method = "class C:\n    def method(self):\n" + "".join(f"        {s}\n" for s in statements)
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "mod.py").write_text(fits + "\n\n" + method)
    assert long_functions(tmp_path / "pkg") == [("pkg/sub/mod.py", "C.method", MAX_FUNCTION_LINES + 1)]
