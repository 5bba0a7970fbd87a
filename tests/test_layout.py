"""The package layout holds: imports run one way, text never imports image-text, each package says what it may import
and imports nothing else, modules stay readable, and moved names still import from their old paths (with a warning).

The import graph is read from the source (every `import` statement, function-level ones included), not from a run.
"""

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "flatcollate"
MAX_LINES = 300
# Old paths of moved modules: gone (one name for one thing), not forwarding.
OLD_PATHS = (
    "flatcollate.attention.packed_segments",
    "flatcollate.attention.reference_flash_attn",
    "flatcollate.attention.reference_kernels",
    "flatcollate.check_cli",
    "flatcollate.check_lengths",
    "flatcollate.modeling.families",
    "flatcollate.models",
    "flatcollate.vision.check",
    "flatcollate.vision.composite",
    "flatcollate.vision.positions",
    "flatcollate.vision.token_types",
    "flatcollate.vision.tiny",
    "flatcollate.vision.tiny_recipes",
)
# Image-text modules; every other module of these packages is text and may not import them.
IMAGE_TEXT = re.compile(
    r"^flatcollate\.(vision(\..*)?|data\.(vision_encode|images|videos)|testing\.(tiny_vision|vision_\w+)|check\.vision"
    r"|bench\.tasks\.vision|synthetic\.images)$"
)
TEXT_PACKAGES = (
    "attention",
    "boundaries",
    "collate",
    "data",
    "modeling",
    "parallel",
    "streaming",
    "training",
    "testing",
)
# Where text and image-text meet: the entry points that pick one or the other.
COMPOSITION = {"flatcollate.data", "flatcollate.data.encoders", "flatcollate.testing"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, str | None]]:
    """`(module, imported name or None)` for every flatcollate import of one module."""
    found = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module
            if not target or not target.startswith("flatcollate"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, None) if sub in known else (target, alias.name))
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.startswith("flatcollate")]
    return found


def graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Module -> modules it imports, and every `(module, source, private name)` imported across modules."""
    known = set(modules())
    edges, private = defaultdict(set), []
    for name, path in modules().items():
        for target, imported in imports(name, path, known):
            if target != name:
                edges[name].add(target)
            if imported and imported.startswith("_") and not imported.startswith("__"):
                private.append((name, target, imported))
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    """`flatcollate.data.encode` -> `data`; a top-level module is its own package (`boundaries`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def declared_imports(package: str) -> set[str]:
    """The packages a package's docstring says it may import: its line `Imports from flatcollate: `a`, `b`.`."""
    path = ROOT / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = next((p for p in doc.split("\n\n") if p.startswith("Imports from flatcollate:")), None)
    assert paragraph is not None, f"flatcollate/{package}/__init__.py: no 'Imports from flatcollate:' paragraph"
    return set(re.findall(r"`([\w.]+)`", paragraph))


def test_the_import_graph_has_no_cycle():
    edges, _ = graph()
    assert cycles(edges) == []


def test_no_module_imports_another_modules_private_names():
    _, private = graph()
    assert private == []


def test_private_modules_are_imported_only_inside_their_package():
    """`collate/_x.py` serves `collate` only; the root's `_conventions`, `_lazy` and `_paths` serve the whole
    library."""
    edges, _ = graph()
    crossing = [
        (name, target)
        for name, targets in edges.items()
        for target in targets
        if target.rpartition(".")[2].startswith("_")
        and target not in ("flatcollate._conventions", "flatcollate._lazy", "flatcollate._paths")
        and package_of(target) != package_of(name)
    ]
    assert crossing == []


def test_text_modules_never_import_image_text_modules():
    edges, _ = graph()
    wrong = [
        (name, target)
        for name, targets in edges.items()
        if package_of(name) in TEXT_PACKAGES and not IMAGE_TEXT.match(name) and name not in COMPOSITION
        for target in targets
        if IMAGE_TEXT.match(target)
    ]
    assert wrong == []


def test_only_the_check_and_the_benchmarks_import_the_testing_package():
    """Tiny models and reference kernels serve the tests, `flatcollate check` and the benchmarks (with the synthetic
    data they draw); nothing that trains imports them."""
    edges, _ = graph()
    users = {package_of(name) for name, targets in edges.items() if any(package_of(t) == "testing" for t in targets)}
    assert users - {"testing"} <= {"check", "bench", "synthetic"}


@pytest.mark.parametrize("package", sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()))
def test_each_package_imports_only_what_its_docstring_declares(package):
    edges, _ = graph()
    used = {
        package_of(target) or target.rpartition(".")[2]
        for name, targets in edges.items()
        if package_of(name) == package
        for target in targets
    } - {package}
    used = {"flatcollate" if name == "" else name for name in used}
    assert used <= declared_imports(package), (
        f"flatcollate/{package} imports {sorted(used - declared_imports(package))}"
    )


def test_modules_stay_readable():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


@pytest.mark.parametrize("old", OLD_PATHS)
def test_old_module_paths_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_build_encoder_has_one_home():
    from flatcollate.data import encode

    assert not hasattr(encode, "build_encoder")


def test_the_layout_test_sees_a_cycle_and_a_private_import(tmp_path):
    """Negative control: the graph reader finds an import cycle and a private name in a package written to disk."""
    package = tmp_path / "flatcollate"
    (package / "a").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a" / "__init__.py").write_text("")
    (package / "a" / "x.py").write_text("from .y import _hidden\n")
    (package / "a" / "y.py").write_text("def f():\n    from . import x\n_hidden = 1\n")
    known = {"flatcollate", "flatcollate.a", "flatcollate.a.x", "flatcollate.a.y"}
    edges = {
        name: {t for t, _ in imports(name, path, known)}
        for name, path in [("flatcollate.a.x", package / "a" / "x.py"), ("flatcollate.a.y", package / "a" / "y.py")]
    }
    assert cycles(edges) == [["flatcollate.a.x", "flatcollate.a.y"]]
    assert ("flatcollate.a.y", "_hidden") in imports("flatcollate.a.x", package / "a" / "x.py", known)


def api_table() -> list[tuple[list[str], list[str]]]:
    """`(names, home packages)` of every row of the README's API table."""
    text = (ROOT.parent / "README.md").read_text()
    table = text.split("## API", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in (line for line in table.splitlines() if line.startswith("| `")):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) >= 3:
            names = re.findall(r"`([\w.]+)", cells[0])
            rows.append((names, re.findall(r"`(\w+)/`", cells[1])))
    return rows


def test_the_readme_api_table_names_the_home_of_each_name():
    """Each name of the README's API table is defined in the first package its row names as home."""
    rows = api_table()
    assert len(rows) >= 10
    for names, homes in rows:
        assert homes, names
        for name in names:
            if name == "flatcollate":
                continue  # the command: `flatcollate check`, `flatcollate bench`
            where, _, attribute = name.removeprefix("flatcollate.").rpartition(".")
            value = getattr(importlib.import_module(f"flatcollate.{where or homes[0]}"), attribute)
            assert value.__module__.startswith(f"flatcollate.{homes[0]}"), (name, value.__module__, homes)
