"""The house rule of docs/DEVELOPING.md: a module imports only from its own layer or a layer below
(function-level imports included), so no arrow runs upward and no circle can form."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "docembed"

# bottom to top; a key is a module or a package (its first dotted part under docembed)
LAYERS = [
    {"types", "errors", "tensors", "runtime", "__init__"},
    {"text", "losses", "scoring"},
    {"io", "datasets"},
    {"models", "zoo", "faiss_index"},
    {"training", "encoding"},
    {"evaluation", "engines", "zoo.export", "similarity"},
    {"cli", "__main__"},
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


def test_the_rule_catches_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from docembed.cli import app\n")
    assert imports_of(module) == {"cli"} and layer_of("cli") > layer_of("models")
