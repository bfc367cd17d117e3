"""Packaging facts that need no build: every third-party module ds4d/ and ds4ctl/ import is
a declared dependency (optional ones behind an extra or a documented command), and the CI
rule that a skipped test fails unless its reason is listed."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("ds4d", "ds4ctl")
# Imported by name but not declared in `dependencies`, each with where it comes from.
OPTIONAL = {
    "matplotlib": "the `plot` extra (ds4d bench --plot)",
}


def imported_top_level_modules() -> set[str]:
    found: set[str] = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - set(PACKAGES) - {"__future__"}


def requirement_name(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_every_third_party_import_is_declared() -> None:
    declared = {requirement_name(r) for r in project()["dependencies"]}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for module in sorted(imported_top_level_modules()):
        if module in OPTIONAL:
            continue
        dists = {requirement_name(d) for d in distributions.get(module, [module])}
        if not dists & declared:
            undeclared[module] = sorted(dists)
    assert not undeclared, f"imported but not in [project] dependencies: {undeclared}"


def test_every_declared_dependency_is_imported() -> None:
    imported = set()
    distributions = importlib.metadata.packages_distributions()
    for module in imported_top_level_modules():
        imported.update(requirement_name(d) for d in distributions.get(module, [module]))
    # tomli is imported on Python < 3.11 only; this interpreter takes tomllib instead
    unused = {requirement_name(r) for r in project()["dependencies"]} - imported - {"tomli"}
    assert not unused, f"declared but never imported: {sorted(unused)}"


def test_optional_imports_have_their_extra() -> None:
    extras = project()["optional-dependencies"]
    assert [requirement_name(r) for r in extras["plot"]] == ["matplotlib"]
    assert set(OPTIONAL) <= imported_top_level_modules()


SKIPS = """
import pytest

def test_skipped_for_no_listed_reason():
    pytest.skip("no widget on this machine")

def test_skipped_for_a_listed_reason():
    pytest.skip("DS4D_TEST_MODEL is not set: needs the real model")
"""


def run_skips(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_skips.py").write_text(SKIPS)
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "--rootdir", str(tmp_path), str(tmp_path)]  # fmt: skip
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_in_ci_an_unlisted_skip_fails(tmp_path: Path) -> None:
    out = run_skips(tmp_path, "true")
    assert out.returncode == 1, out.stdout
    assert "1 failed, 1 skipped" in out.stdout
    assert "skipped in CI without a listed reason: no widget on this machine" in out.stdout


def test_outside_ci_skips_are_skips(tmp_path: Path) -> None:
    out = run_skips(tmp_path, None)
    assert out.returncode == 0, out.stdout
    assert "2 skipped" in out.stdout


# Each layer imports only the layers below it (docs/architecture.md), and every package of
# ds4d/ is one of these layers.
LAYER_IMPORTS = {
    "engine": {"engine"},
    "chat": {"chat", "engine"},
    "state": {"state", "chat", "engine"},
    # the engine loop and the pieces of a generation (not the protocols: api is beside it)
    "serving": {"serving", "state", "chat", "engine"},
    "api": {"api", "chat", "engine", "state"},
    # not the developer tools or the command-line front end above it
    "daemon": {"daemon", "serving", "api", "state", "chat", "engine"},
    # bench, synth, the serve-process helper: never imported by what serves
    "tools": {"tools", "daemon", "serving", "api", "state", "chat", "engine"},
    # and ds4d/__init__.py, for `ds4d --version`
    "cli": {"cli", "tools", "daemon", "serving", "api", "state", "chat", "engine", "__init__"},
}
# What ds4d/ holds besides its layers' packages: the package itself and `python -m ds4d`.
ROOT_MODULES = {"__init__.py", "__main__.py"}


def ds4d_imports(path: Path) -> set[str]:
    """The ds4d.* modules a file imports (relative imports resolved)."""
    rel = path.relative_to(REPO).with_suffix("")
    package = list(rel.parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "ds4d")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module and node.module.split(".")[0] == "ds4d":
                found.add(node.module)
    return found


def test_layers_import_only_the_layers_below() -> None:
    wrong = []
    for layer, allowed in LAYER_IMPORTS.items():
        for path in sorted((REPO / "ds4d" / layer).rglob("*.py")):
            for module in ds4d_imports(path):
                parts = module.split(".")
                if (parts[1] if len(parts) > 1 else "__init__") not in allowed:
                    wrong.append(f"{path.relative_to(REPO)} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_every_package_of_ds4d_is_a_layer() -> None:
    """A new package must take its place in the layer table (here and in
    docs/architecture.md) before anything checks what it imports."""
    packages = {p.name for p in (REPO / "ds4d").iterdir() if (p / "__init__.py").is_file()}
    unplaced = packages - set(LAYER_IMPORTS)
    assert not unplaced, f"ds4d packages in no layer (add them to LAYER_IMPORTS): {unplaced}"
    doc = (REPO / "docs" / "architecture.md").read_text("utf-8")
    undocumented = [p for p in sorted(packages) if f"| `ds4d/{p}/` |" not in doc]
    assert not undocumented, f"missing from the layer table of docs/architecture.md: {undocumented}"


def test_ds4d_has_no_loose_modules() -> None:
    """Every module of ds4d/ lives in the package of its layer: a newcomer sees from the
    folder names what is the daemon, the engine, the protocols and the tools."""
    loose = {p.name for p in (REPO / "ds4d").glob("*.py")} - ROOT_MODULES
    assert not loose, f"modules at ds4d/'s root (move them into a layer's package): {loose}"


def test_tests_mirror_the_package() -> None:
    """tests/ holds folders (one per layer, e2e, reference, helpers), no test file of its own
    besides the shared conftest.py; each folder is a package, so two folders may hold test
    modules of the same name (tests/engine/test_vectors.py, tests/engine/deepseek4/...)."""
    loose = sorted(p.name for p in (REPO / "tests").glob("*.py"))
    assert loose == ["__init__.py", "conftest.py"], f"files at tests/'s root: {loose}"
    folders = {p.parent for p in (REPO / "tests").rglob("*.py")}
    not_packages = sorted(
        str(d.relative_to(REPO)) for d in folders if not (d / "__init__.py").is_file()
    )
    assert not not_packages, f"test folders without __init__.py: {not_packages}"


def _raised_names(tree: ast.AST) -> set[str]:
    """The names of the exception classes `raise` statements raise (`raise X(...)`,
    `raise X`, `raise mod.X(...)`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name):
                names.add(exc.id)
            elif isinstance(exc, ast.Attribute):
                names.add(exc.attr)
    return names


def test_only_the_api_layer_raises_protocol_errors() -> None:
    """ApiError (an HTTP status and a protocol's error fields) is raised in ds4d/api only:
    the layers below raise the neutral refusals of ds4d.chat.errors, which ds4d/api maps.
    A helper building an ApiError for `raise` (`bad(...)`) counts when it is imported."""
    wrong = []
    for path in sorted((REPO / "ds4d").rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[1] == "api":
            continue
        tree = ast.parse(path.read_text("utf-8"))
        if "ApiError" in _raised_names(tree):
            wrong.append(f"{rel} raises ApiError")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "ds4d.api.common":
                if any(a.name == "bad" for a in node.names):
                    wrong.append(f"{rel} imports ds4d.api.common.bad")
    assert not wrong, "\n".join(wrong)


def test_the_protocol_error_check_sees_a_raise() -> None:
    """The check above finds each spelling of a raise (so it cannot pass vacuously)."""
    tree = ast.parse("raise ApiError(400, 'x')\nraise common.ApiError\nraise Other()\n")
    assert _raised_names(tree) == {"ApiError", "Other"}


def test_ds4ctl_imports_only_the_admin_protocol() -> None:
    imported = set()
    for path in (REPO / "ds4ctl").rglob("*.py"):
        imported |= {m for m in ds4d_imports(path) if m.startswith("ds4d")}
    assert imported <= {"ds4d.daemon.admin_protocol"}, imported


def test_every_sleep_in_the_tests_is_a_reviewed_exception() -> None:
    """No test waits on the wall clock unless the line says why: a bounded poll of another
    process, virtual time, or a reviewed exception explained just above it."""
    marks = ("# poll:", "virtual time", "Reviewed exception", "# a slow disk")
    unexplained = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == "test_packaging.py":
            continue
        lines = path.read_text("utf-8").splitlines()
        for i, line in enumerate(lines):
            if re.search(r"\btime\.sleep\(|\btrio\.sleep\(", line):
                context = "\n".join(lines[max(0, i - 3) : i + 1])
                if not any(m in context for m in marks):
                    unexplained.append(f"{path.relative_to(REPO)}:{i + 1}: {line.strip()}")
    assert not unexplained, "\n".join(unexplained)


def test_every_slow_test_listed_exists() -> None:
    """SLOW_TESTS in tests/conftest.py names files and test functions that exist, so a
    rename cannot quietly move a slow test into the fast tier."""
    from tests.conftest import SLOW_TESTS

    for key in SLOW_TESTS:
        file, _, test = key.partition("::")
        path = REPO / file
        assert path.is_file(), key
        if test:
            name = test.split("[")[0]
            functions = {
                node.name
                for node in ast.walk(ast.parse(path.read_text("utf-8")))
                if isinstance(node, ast.FunctionDef)
            }
            assert name in functions, key


def test_every_module_run_first_exists() -> None:
    """RUN_FIRST in tests/conftest.py (the long modules `make test` starts first) names
    test files that exist, once each, so a rename cannot quietly send a long module to the
    end of the run."""
    from tests.conftest import RUN_FIRST

    assert len(set(RUN_FIRST)) == len(RUN_FIRST)
    missing = [m for m in RUN_FIRST if not (REPO / m).is_file()]
    assert not missing, missing


def test_no_source_refers_to_documents_outside_the_repo() -> None:
    """Comments explain in place: none points at a path outside the checkout."""
    outside = re.compile(r"\.\./shared|design\.md|specs/dsv4|spec §")
    found = []
    for root in ("ds4d", "ds4ctl", "native"):
        for path in sorted((REPO / root).rglob("*")):
            if path.suffix in (".py", ".c", ".h") and outside.search(path.read_text("utf-8")):
                found.append(str(path.relative_to(REPO)))
    assert not found, found


# A path the README or a docs/ page cites: a file of the checkout.
CITED_PATH = re.compile(
    r"(?<![\w./-])((?:scripts|tests|docs|native|ds4d|ds4ctl|fuzz)/[\w./-]*\w"
    r"\.(?:py|md|sh|png|csv|c|h|toml|json|txt))(?!\w)"
)
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def documentation_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_readme_is_for_users_and_everything_cited_is_in_the_repo() -> None:
    """The README stays short (details go to docs/), and the README and docs/ cite only
    files of the checkout: each command a measurement names can be run from it."""
    readme = (REPO / "README.md").read_text("utf-8")
    assert len(readme.splitlines()) <= 300, "README.md over 300 lines: move details to docs/"
    missing = []
    for page in documentation_pages():
        text = page.read_text("utf-8")
        if re.search(r"\.\./shared|/work/", text):
            missing.append(f"{page.name}: a path outside the repository")
        missing += [f"{page.name}: {m}" for m in CITED_PATH.findall(text)
                    if not (REPO / m).exists()]  # fmt: skip
        for link in MARKDOWN_LINK.findall(text):
            if "://" not in link and not (page.parent / link).exists():
                missing.append(f"{page.name}: link {link}")
    assert not missing, "\n".join(missing)


def test_the_citation_check_sees_paths_and_links() -> None:
    """The check above finds a cited path and a link (so it cannot pass vacuously)."""
    text = "run `scripts/figures/decode_figure.py`, see [the format](kv-cache-format.md)"
    assert CITED_PATH.findall(text) == ["scripts/figures/decode_figure.py"]
    assert MARKDOWN_LINK.findall(text) == ["kv-cache-format.md"]


# The objects composed at construction (docs/architecture.md, "How the daemon is put
# together"): what they are built from, nobody sets afterwards.
COMPONENTS = {
    "ds4d/daemon/server.py": ["Daemon"],
    "ds4d/daemon/control.py": ["ControlPlane"],
    "ds4d/daemon/models.py": ["ModelRegistry"],
    "ds4d/daemon/served.py": ["ServedModel"],
    "ds4d/serving/gate.py": ["ComputeGate"],
    "ds4d/serving/loop.py": ["EngineLoop"],
    "ds4d/serving/model.py": ["ModelServer"],
    "ds4d/serving/prompt.py": ["PromptPreparer"],
    "ds4d/state/service.py": ["StateService", "CacheView"],
    "ds4d/state/kvstate.py": ["KVState"],
    "ds4d/state/diskcache.py": ["DiskCache"],
}


def _wired_attributes(cls: ast.ClassDef) -> set[str]:
    """What `__init__` sets from its parameters, or to None (to be filled in later)."""
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    params = {a.arg for a in init.args.args + init.args.kwonlyargs} - {"self"}
    wired = set()
    for node in ast.walk(init):
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        used = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
        late = isinstance(node.value, ast.Constant) and node.value.value is None
        if used & params or late:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    wired.add(target.attr)
    return wired


def test_no_module_sets_what_a_component_was_built_from() -> None:
    """Composition through constructors: an attribute a component's constructor sets
    from its parameters (or to None, for later) is never assigned from outside that
    object, not even by another component (`daemon.gate.pace = ...`, `service.trace =
    ...`, `disk.writer = ...`); a value reloaded live goes through a method of the
    class, named as such."""
    wired: dict[str, set[str]] = {}
    for file, names in COMPONENTS.items():
        tree = ast.parse((REPO / file).read_text("utf-8"))
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and cls.name in names:
                for attr in _wired_attributes(cls):
                    wired.setdefault(attr, set()).add(cls.name)
    assert {"config", "writer", "trace", "min_tokens", "daily_write_bytes"} <= set(wired)
    wrong = []
    for path in sorted((REPO / "ds4d").rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr in wired
                    and ast.unparse(target.value) not in ("self", "cls")
                ):
                    where = f"{path.relative_to(REPO)}:{node.lineno}"
                    wrong.append(f"{where}: {ast.unparse(target)} ({sorted(wired[target.attr])})")
    assert not wrong, "\n".join(wrong)
