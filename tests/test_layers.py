"""The house rules, checked on the source (AST, nothing imported):

1. One-way layers. zerokit/ is core -> spec -> estimate -> planning -> config -> report | measure -> launching ->
   api -> serve -> cli | integrations: a module imports only from its own layer or the layers before it (siblings do not
   import each other). Every import counts, also the lazy ones inside functions.
2. No import cycles between modules, lazy imports included.
3. Heavy libraries (torch, deepspeed, transformers, peft, bitsandbytes, datasets, matplotlib, numpy,
   accelerate, huggingface_hub, safetensors) are imported inside the functions that need them, so `--help` and a
   `--params` plan stay instant (tests/test_cli.py checks that at run time too).
4. Only zerokit/cli/ touches argparse.

An import is every `import`, every `from ... import`, and every `importlib.import_module("zerokit...")`,
`__import__(...)` or `runpy.run_module(...)` of a zerokit module named by a string; code under
`if __name__ == "__main__":` counts like any other (a script entry point in a lower layer may not reach up either).
5. zerokit.launching.train is the ranks' entry point (`python -m zerokit.launching.train`): no zerokit module imports it,
   so it runs once, as __main__.

A test at the end proves the checker fails when a layer import is reversed, also through importlib or a __main__
guard.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "zerokit"

# integrations: what runs inside a user's own training script (the HF Trainer callback); a sibling of cli
LAYERS = ("core", "spec", "estimate", "planning", "config", ("report", "measure"), "launching", "api", "serve",
          ("cli", "integrations"))
HEAVY = ("torch", "deepspeed", "transformers", "peft", "bitsandbytes", "datasets", "matplotlib", "numpy",
         "accelerate", "huggingface_hub", "safetensors")
# Modules that must import a heavy library at module level, and why. Nothing imports them at module level
# (checked below), so they load only where their work runs.
HEAVY_AT_IMPORT = {
    # its classes subclass torch's TorchDispatchMode; imported only inside training ranks and benchmarks
    "zerokit.measure.meter",
    # ZerokitCallback subclasses transformers' TrainerCallback; imported only by training scripts that use it
    "zerokit.integrations.hf",
}


def _layer_of(module: str) -> tuple[int, str] | None:
    """(layer index, package) of a zerokit module; None for the package's own top (zerokit, zerokit.__main__)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "zerokit":
        return None
    pkg = parts[1]
    if pkg == "__main__":
        pkg = "cli"
    for i, layer in enumerate(LAYERS):
        if pkg == layer or (isinstance(layer, tuple) and pkg in layer):
            return i, pkg
    return -1, pkg  # zerokit.data / unknown: flagged by test_every_module_is_in_a_layer


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_main_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators))


def imports_of(source: str, module: str) -> list[tuple[str, int, bool, bool]]:
    """(imported module, line, at module level, inside a __main__ guard) for every import in the source.
    `from zerokit.x import y` counts as an import of zerokit.x.y when that is a module, else of zerokit.x."""
    tree = ast.parse(source)
    out = []
    is_pkg = False

    def visit(node, top: bool, main: bool):
        for child in ast.iter_child_nodes(node):
            child_top = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            child_main = main or _is_main_guard(child)
            if isinstance(child, ast.Import):
                for a in child.names:
                    out.append((a.name, child.lineno, top, main))
            elif isinstance(child, ast.Call) and _dynamic_import(child):
                out.append((_dynamic_import(child), child.lineno, top, main))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative import
                    pkg_parts = module.split(".") if is_pkg else module.split(".")[:-1]
                    pkg_parts = pkg_parts[: len(pkg_parts) - (child.level - 1)]
                    base = ".".join(pkg_parts + ([base] if base else []))
                for a in child.names:
                    full = f"{base}.{a.name}"
                    out.append((full if _exists(full) else base, child.lineno, top, main))
            visit(child, child_top, child_main)

    visit(tree, True, False)
    return out


DYNAMIC_IMPORTS = {"import_module", "__import__", "run_module"}  # importlib's, the builtin, runpy's


def _dynamic_import(call: ast.Call) -> str | None:
    """The zerokit module a call such as importlib.import_module("zerokit.x") imports, else None."""
    fn = call.func
    name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
    if name not in DYNAMIC_IMPORTS or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("zerokit"):
        return arg.value
    return None


def _exists(module: str) -> bool:
    if not module.startswith("zerokit."):
        return False
    p = PACKAGE.parent / module.replace(".", "/")
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _all_modules() -> dict[str, str]:
    return {_module_name(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


def layer_violations(modules: dict[str, str]) -> list[str]:
    bad = []
    for mod, src in modules.items():
        mine = _layer_of(mod)
        for imported, line, _top, _main in imports_of(src, mod):
            theirs = _layer_of(imported) if imported.startswith("zerokit.") else None
            if mine is None or theirs is None:
                continue
            upward = theirs[0] > mine[0]
            sideways = theirs[0] == mine[0] and theirs[1] != mine[1]
            if upward or sideways:
                bad.append(f"{mod}:{line} imports {imported} ({theirs[1]} is {'above' if upward else 'beside'} {mine[1]})")
    return bad


def import_cycles(modules: dict[str, str]) -> list[list[str]]:
    graph = {m: set() for m in modules}
    for mod, src in modules.items():
        for imported, _line, _top, _main in imports_of(src, mod):
            # `from zerokit.spec import model` resolves to zerokit.spec.model; a package import is its __init__
            if imported in graph and imported != mod and not mod.startswith(imported + "."):
                graph[mod].add(imported)
    # Tarjan's strongly connected components: any component of 2+ modules is a cycle
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return comps


def test_every_module_is_in_a_layer():
    stray = [m for m in _all_modules() if (_layer_of(m) or (0,))[0] == -1]
    assert not stray, f"modules outside the layers {LAYERS}: {stray}"


def test_layers_are_one_way():
    bad = layer_violations(_all_modules())
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


def test_no_import_cycles():
    cycles = import_cycles(_all_modules())
    assert not cycles, f"import cycles: {cycles}"


def test_heavy_libraries_are_imported_lazily():
    modules = _all_modules()
    bad = []
    for mod, src in modules.items():
        for imported, line, top, _main in imports_of(src, mod):
            if not top:
                continue
            if imported.split(".")[0] in HEAVY and mod not in HEAVY_AT_IMPORT:
                bad.append(f"{mod}:{line} imports {imported} at module level")
            if imported in HEAVY_AT_IMPORT:
                bad.append(f"{mod}:{line} imports {imported} (which loads torch) at module level")
    assert not bad, "\n".join(bad)


RANK_ENTRY = "zerokit.launching.train"


def test_the_rank_entry_point_is_imported_by_no_module():
    """`python -m zerokit.launching.train` runs the module as __main__; an import of it from zerokit (as the old
    cli/rank.py did) would run it a second time in every rank, with a second copy of each class and global."""
    bad = [f"{mod}:{line}" for mod, src in _all_modules().items() if mod != RANK_ENTRY
           for imported, line, _top, _main in imports_of(src, mod) if imported == RANK_ENTRY]
    assert not bad, f"{RANK_ENTRY} is imported by {bad}"


def test_only_cli_touches_argparse():
    bad = [f"{mod}:{line}" for mod, src in _all_modules().items() if not mod.startswith("zerokit.cli")
           for imported, line, _top, _main in imports_of(src, mod) if imported.split(".")[0] == "argparse"]
    assert not bad, f"argparse outside zerokit/cli: {bad}"


@pytest.mark.parametrize("case", ["upward", "sideways", "cycle", "importlib", "main-guard", "rank-entry"])
def test_the_checker_catches_a_reversed_import(case):
    """The checks above fail when a layer import is reversed: mutate real modules in memory and look."""
    modules = _all_modules()
    if case == "upward":  # the memory model reaching up into the planner
        modules["zerokit.estimate.memory"] += "\nfrom zerokit.planning.planner import make_plan\n"
        assert any("zerokit.estimate.memory" in v and "planning is above estimate" in v for v in layer_violations(modules))
    elif case == "sideways":  # the report reading the meter
        modules["zerokit.report.run_report"] += "\ndef f():\n    from zerokit.measure.meter import MemoryMeter\n"
        assert any("measure is beside report" in v for v in layer_violations(modules))
    elif case == "importlib":  # a module name in a string still counts
        modules["zerokit.spec.model"] += "\nimport importlib\nimportlib.import_module('zerokit.launching.data')\n"
        assert any("zerokit.spec.model" in v and "launching is above spec" in v for v in layer_violations(modules))
    elif case == "main-guard":  # as launching/train.py once reached into cli/ from its __main__ guard
        modules["zerokit.launching.command"] += "\nif __name__ == '__main__':\n    from zerokit.cli import main\n"
        assert any("zerokit.launching.command" in v and "cli is above launching" in v for v in layer_violations(modules))
    elif case == "rank-entry":
        modules["zerokit.launching.execute"] += "\ndef f():\n    from zerokit.launching.train import main\n"
        with pytest.raises(AssertionError, match="zerokit.launching.execute"):
            _all_modules_orig, globals()["_all_modules"] = _all_modules, lambda: modules
            try:
                test_the_rank_entry_point_is_imported_by_no_module()
            finally:
                globals()["_all_modules"] = _all_modules_orig
    else:  # two modules of one layer importing each other, lazily
        modules["zerokit.spec.hardware"] += "\ndef f():\n    from zerokit.spec.hostfile import parse_hostfile\n"
        modules["zerokit.spec.hostfile"] += "\ndef g():\n    from zerokit.spec.hardware import build_cluster\n"
        assert ["zerokit.spec.hardware", "zerokit.spec.hostfile"] in import_cycles(modules)
