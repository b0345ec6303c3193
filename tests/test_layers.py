"""Imports point one way (docs/architecture.md): every import in edged/, at the top of a module
or inside a function, and every `from edged...` line of the Cython sources (the compiled
modules edged._core, _bpe, _gguf_scan) goes to the importer's own layer or one below it."""
import ast
import os
import re

from conftest import ROOT

# Lowest first. A module may import its own layer and the layers before it. `edged` itself is
# the public facade (edged.Model, ... imported lazily): code inside the package does not use it.
LAYERS = [
    ("base", ["edged.errors", "edged.files", "edged.system", "edged.data", "edged._*"]),
    ("format", ["edged.format"]),
    ("text", ["edged.text"]),
    ("engine", ["edged.engine"]),
    ("trust", ["edged.trust"]),
    ("service", ["edged.service"]),
    ("commands", ["edged.commands"]),
    ("entry", ["edged.cli", "edged.__main__", "edged"]),
]


def layer_of(module):
    """(rank, name) of the layer that holds `module`, None when no layer claims it."""
    best = None
    for rank, (name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if p.endswith("*"):
                hit = module.startswith(p[:-1])
            else:   # the facade `edged` is only itself
                hit = module == p or (p != "edged" and module.startswith(p + "."))
            if hit and (best is None or len(p) > best[0]):
                best = (len(p), rank, name)
    return best and best[1:]


def package_modules(root=ROOT):
    """{module name: (path, source)} for edged/**/*.py, and the compiled modules' names."""
    modules, compiled = {}, set()
    for d, _, files in os.walk(os.path.join(root, "edged")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)[:-3].split(os.sep)
                name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
                with open(path, encoding="utf-8") as fh:
                    modules[name] = (os.path.relpath(path, root), fh.read())
    for d, _, files in os.walk(os.path.join(root, "cython_kernels")):
        compiled.update("edged._" + f[:-4] for f in files if f.endswith(".pyx"))
    return modules, compiled


def imports(module, source, is_package, known):
    """(line, imported module) for every import in `source`, nested ones included, and every
    importlib.import_module("edged...") with a literal name."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package[:len(package) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:   # `from pkg import mod` imports pkg.mod
                yield node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
              in ("import_module", "__import__") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def violations(modules, compiled):
    """Upward imports and modules no layer claims, as readable lines."""
    known = set(modules) | compiled
    out = []
    for module, (path, source) in sorted(modules.items()):
        own = layer_of(module)
        if own is None:
            out.append(f"{path}: module {module} is in no layer (tests/test_layers.py LAYERS, "
                       "docs/architecture.md)")
            continue
        for line, target in imports(module, source, path.endswith("__init__.py"), known):
            if target != "edged" and not target.startswith("edged."):
                continue
            dest = layer_of(target)
            if dest is not None and dest[0] > own[0]:
                out.append(f"{path}:{line}: {own[1]} layer imports {target} ({dest[1]} layer)")
    return out


def cython_violations(root=ROOT):
    """The compiled modules sit in the base layer: their Python imports may reach only it."""
    out = []
    pattern = re.compile(r"^\s*(?:from|import)\s+(edged(?:\.\w+)*)")
    for d, _, files in os.walk(os.path.join(root, "cython_kernels")):
        for f in sorted(files):
            if f.endswith((".pyx", ".pxi")):
                path = os.path.join(d, f)
                with open(path, encoding="utf-8") as fh:
                    for i, text in enumerate(fh, 1):
                        m = pattern.match(text)
                        if m and (layer_of(m.group(1)) or (99,))[0] > 0:
                            out.append(f"{os.path.relpath(path, root)}:{i}: compiled code imports "
                                       f"{m.group(1)} (only the base layer)")
    return out


def test_no_module_imports_a_higher_layer():
    modules, compiled = package_modules()
    assert len(modules) > 50 and "edged._core" in compiled
    assert violations(modules, compiled) + cython_violations() == []


def test_the_check_sees_imports_inside_functions_and_by_name():
    """A planted upward import is found wherever it hides: in a function, relative, through
    `from pkg import module`, through importlib, or through the facade."""
    modules, compiled = package_modules()
    planted = {
        "edged.format.planted": ("edged/format/planted.py",
                                 "def f():\n    from ..engine import threads\n"),
        "edged.text.planted": ("edged/text/planted.py",
                               "import importlib\nM = importlib.import_module('edged.trust.verify')\n"),
        "edged.engine.planted": ("edged/engine/planted.py",
                                 "class A:\n    def m(self):\n        from edged.trust import verify\n"),
        "edged.trust.planted": ("edged/trust/planted.py", "from edged import Model\n"),
        "edged.errors_planted": ("edged/errors_planted.py", "x = 1\n"),
    }
    found = violations({**modules, **planted}, compiled)
    assert found == [
        "edged/engine/planted.py:3: engine layer imports edged.trust.verify (trust layer)",
        "edged/errors_planted.py: module edged.errors_planted is in no layer "
        "(tests/test_layers.py LAYERS, docs/architecture.md)",
        "edged/format/planted.py:2: format layer imports edged.engine.threads (engine layer)",
        "edged/text/planted.py:2: text layer imports edged.trust.verify (trust layer)",
        "edged/trust/planted.py:1: trust layer imports edged (entry layer)",
    ]


def test_test_modules_share_code_through_tests_support_only():
    """A test module imported by another runs its module-level code twice and couples the two:
    what tests share lives in tests/support (or conftest.py)."""
    found = []
    for d, _, files in os.walk(os.path.join(ROOT, "tests")):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
                for node in ast.walk(tree):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                             [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    found += [f"{os.path.relpath(path, ROOT)}:{node.lineno}: imports {n}"
                              for n in names if n.split(".")[0].startswith("test_")]
    assert found == []
