"""The house rule of docs/DEVELOPING.md: a module imports only from its own layer or a layer below
(function-level imports included), so no arrow runs upward and no circle can form."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "docembed"

# bottom to top; a key is a module or a package (its first dotted part under docembed)
LAYERS = [
    {"types", "errors", "tensors", "runtime", "version"},
    {"text", "losses", "scoring"},
    {"io", "datasets"},
    {"models", "zoo", "faiss_index", "lance_index", "passages"},
    {"training", "encoding", "parallel", "remote"},
    {"evaluation", "engines", "zoo.export", "similarity", "api", "server"},
    {"cli", "__main__", "__init__", "integrations"},
]


def layer_of(dotted: str) -> int:
    parts = dotted.split(".")
    for key in (".".join(parts[:2]), parts[0]):
        for index, members in enumerate(LAYERS):
            if key in members:
                return index
    raise AssertionError(f"docembed.{dotted} is in no layer: add it to LAYERS and docs/DEVELOPING.md")


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "docembed":  # a submodule, or a name of the package root (__version__)
                for alias in node.names:
                    is_module = (PACKAGE / alias.name).is_dir() or (PACKAGE / f"{alias.name}.py").exists()
                    found.add(alias.name if is_module else "__init__")
            elif node.module.startswith("docembed."):
                found.add(node.module.removeprefix("docembed."))
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("docembed.") for a in node.names if a.name.startswith("docembed.")
            )
    return found


def test_no_module_imports_from_a_layer_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        dotted = dotted.removesuffix(".__init__") if dotted != "__init__" else dotted
        own = layer_of(dotted)
        for target in sorted(imports_of(path)):
            if layer_of(target) > own:
                upward.append(
                    f"docembed.{dotted} (layer {own}) imports docembed.{target} (layer {layer_of(target)})"
                )
    assert not upward, "\n".join(upward)


def module_graph(package: Path) -> dict[str, set[str]]:
    """docembed module -> the docembed modules it imports (function-level imports included; `from a.b import
    c` counts as a.b.c when that is a module, else as a.b)."""

    def name_of(path: Path) -> str:
        parts = path.relative_to(package).with_suffix("").parts
        return ".".join(("docembed", *(parts[:-1] if parts[-1] == "__init__" else parts)))

    modules = {name_of(path): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_import_circle():
    # Layers allow imports within a layer (models <-> zoo loader), so a circle needs its own check.
    circles = import_circles(module_graph(PACKAGE))
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle(tmp_path):
    package = tmp_path / "docembed"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models" / "__init__.py").write_text("")
    (package / "models" / "a.py").write_text("def f():\n    from docembed.models import b\n")
    (package / "models" / "b.py").write_text("from docembed.models.c import x\n")
    (package / "models" / "c.py").write_text("import docembed.models.a\nx = 1\n")
    (package / "models" / "d.py").write_text("from docembed.models import a\n")
    graph = module_graph(package)
    assert import_circles(graph) == [["docembed.models.a", "docembed.models.b", "docembed.models.c"]]


def test_the_rule_catches_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from docembed.cli import app\n")
    assert imports_of(module) == {"cli"} and layer_of("cli") > layer_of("models")


# cli/ modules that declare options and hold no command: the command modules may import these alone.
CLI_OPTION_MODULES = {"common", "training_options"}


def cli_modules_imported_by(path: Path) -> set[str]:
    """The docembed.cli modules `path` imports: `from docembed.cli import common` names cli.common, while
    `from docembed.cli import app` names the package itself (cli), the root that registers every command."""
    found = {name for name in imports_of(path) if name.startswith("cli.")}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "docembed.cli" and node.level == 0:
            for alias in node.names:
                is_module = (PACKAGE / "cli" / f"{alias.name}.py").exists()
                found.add(f"cli.{alias.name}" if is_module else "cli")
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("docembed.") for a in node.names if a.name == "docembed.cli")
    return found


def test_no_command_module_imports_another():
    # A command parses, calls library code and prints: what two commands share belongs below cli/.
    allowed = {f"cli.{name}" for name in CLI_OPTION_MODULES}
    crossing = [
        f"docembed.cli.{path.stem} imports docembed.{target}"
        for path in sorted((PACKAGE / "cli").glob("*.py"))
        if path.stem not in CLI_OPTION_MODULES | {"__init__"}
        for target in sorted(cli_modules_imported_by(path) - allowed)
    ]
    assert not crossing, "\n".join(crossing)


def test_the_command_rule_catches_a_command_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from docembed.cli import common\nfrom docembed.cli.training_options import loop_options\n"
        "def f():\n    from docembed.cli.train_pv import train_pv\n    from docembed.cli import app\n"
    )
    assert cli_modules_imported_by(module) == {"cli.common", "cli.training_options", "cli.train_pv", "cli"}
