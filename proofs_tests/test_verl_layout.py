"""The veRL integration package ships only what a veRL run uses: every module of ``dualkv.integration.verl`` is
imported by the product package itself or is one of its entry points (the ``verl.plugins`` entry point, the config
class named by ``_target_``). Test scaffolding — the CPU platform shim, import stubs, synthetic rollouts — lives in
``proofs_tests/verl_fixtures`` (the tests and ``experiments/policy_update_bench.py`` import it from there)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERL_PACKAGE = "dualkv.integration.verl"
#: Loaded by veRL, not by an import statement: the plugin (pyproject's entry point) and the config (``_target_``).
ENTRY_POINTS = {f"{VERL_PACKAGE}.plugin", f"{VERL_PACKAGE}.config"}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path) -> set[str]:
    """Absolute names of every module (and ``module.attribute``) ``path`` imports."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _unused_modules(root: Path = ROOT) -> list[str]:
    """Modules of the veRL integration under ``root``/dualkv that neither the package nor veRL loads."""
    imported = set().union(*(_imports(p, root) for p in (root / "dualkv").rglob("*.py")))
    modules = {_module_name(p, root) for p in (root / "dualkv" / "integration" / "verl").glob("*.py")}
    return sorted(m for m in modules if m != VERL_PACKAGE and m not in imported and m not in ENTRY_POINTS)


def test_every_verl_module_serves_the_product():
    assert _unused_modules() == [], "modules of the veRL integration that only tests/experiments use: move them to " \
                                    "proofs_tests/verl_fixtures"


def test_scaffolding_is_with_the_tests():
    fixtures = ROOT / "proofs_tests" / "verl_fixtures"
    assert {"cpu_platform.py", "import_stubs.py", "synthetic.py"} <= {p.name for p in fixtures.glob("*.py")}
    assert 'dualkv = "dualkv.integration.verl.plugin"' in (ROOT / "pyproject.toml").read_text()


def test_a_test_only_module_is_caught(tmp_path):
    """Known-wrong control: a module that nothing in the package imports is reported."""
    shutil.copytree(ROOT / "dualkv", tmp_path / "dualkv", ignore=shutil.ignore_patterns("csrc", "__pycache__"))
    (tmp_path / "dualkv" / "integration" / "verl" / "cpu_platform.py").write_text('"""test-only helper"""\n')
    assert _unused_modules(tmp_path) == [f"{VERL_PACKAGE}.cpu_platform"]
