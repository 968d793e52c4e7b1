"""Every SVG snapshot belongs to a test. syrupy reports unused snapshots only when pytest runs without xdist, and
make test runs on two workers: this check stands in for it, so a renamed or removed snapshot test cannot leave its
old picture behind unnoticed."""

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def functions_of(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def orphans(root: Path) -> list[str]:
    """Snapshots (root/<test module>/<test name>.svg) whose module or test no longer exists."""
    found = []
    for svg in sorted(root.glob("*/*.svg")):
        module = root.parent / f"{svg.parent.name}.py"
        if not module.exists() or svg.stem not in functions_of(module):
            found.append(f"{svg.parent.name}/{svg.name}")
    return found


def test_every_snapshot_has_its_test():
    assert list((TESTS / "__snapshots__").glob("*/*.svg")), "the snapshot folder moved: update this check"
    assert orphans(TESTS / "__snapshots__") == []


def test_a_snapshot_without_its_test_is_found(tmp_path):
    (tmp_path / "test_screen.py").write_text("def test_kept(snap_compare):\n    pass\n")
    (tmp_path / "__snapshots__" / "test_screen").mkdir(parents=True)
    for name in ("test_kept", "test_renamed"):
        (tmp_path / "__snapshots__" / "test_screen" / f"{name}.svg").write_text("<svg/>")
    (tmp_path / "__snapshots__" / "test_gone").mkdir()
    (tmp_path / "__snapshots__" / "test_gone" / "test_x.svg").write_text("<svg/>")
    assert orphans(tmp_path / "__snapshots__") == ["test_gone/test_x.svg", "test_screen/test_renamed.svg"]
