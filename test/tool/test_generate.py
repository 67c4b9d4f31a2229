"""``generate``: every release's series from one source (fix/), on a small
synthetic fix and pristine trees, so each property is checked without torch."""

from __future__ import annotations

import difflib
import shutil
import textwrap
from pathlib import Path

import pytest

from torch_fork_overlay import generate as g
from torch_fork_overlay.apply import patch_tree
from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.refresh import Pristine
from torch_fork_overlay.series import load_series

PRISTINE = {
    "1.0.0": {
        "torch/x.py": "import os\n\n\n\n\ndef x():\n    return 1\n\n\n\n\nX = 1\n",
        "torch/y.py": "def y(a):\n    return a\n",
    },
    "1.1.0": {
        "torch/x.py": "import os\nimport sys\n\n\n\n\ndef x():\n    return 1\n\n\n\n\nX = 1\n",
        "torch/y.py": "def y(a, b=None):\n    return a\n",
    },
}


def _diff(rel: str, old: str, new: str, why: str = "") -> str:
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")
    return (why + "\n" if why else "") + f"diff --git a/{rel} b/{rel}\n" + "".join(lines)


@pytest.fixture
def fix(tmp_path: Path) -> Path:
    """A fix with three patches: 'core' adds a module and hooks torch/x.py
    (a default hook written against 1.1.0), 'y' hooks torch/y.py with an
    override for 1.0.0, 'old' exists only for 1.0.0."""
    fix = tmp_path / "fix"
    (fix / "src" / "torch").mkdir(parents=True)
    (fix / "src" / "torch" / "_new.py").write_text("def new():\n    return 'new'\n")
    (fix / "messages").mkdir()
    for pid in ("core", "y", "old"):
        (fix / "messages" / f"{pid}.txt").write_text(f"area: Do the {pid} thing\n\nWhy {pid}.\n")
    (fix / "stack.toml").write_text(textwrap.dedent("""\
        releases = ["1.0.0", "1.1.0"]
        [[patch]]
        id = "old"
        message = "messages/old.txt"
        last = "1.0.0"
        [[patch]]
        id = "core"
        message = "messages/core.txt"
        new = ["torch/_new.py"]
        tests = ["test/test_core.py"]
        [[patch]]
        id = "y"
        message = "messages/y.txt"
        note = "kept opt-in: measured 2x."
    """))
    new_x = PRISTINE["1.1.0"]["torch/x.py"].replace("    return 1\n", "    from torch._new import new\n\n    return new()\n")
    hooks = fix / "hooks"
    (hooks / "core" / "torch").mkdir(parents=True)
    (hooks / "core" / "torch" / "x.py.diff").write_text(_diff("torch/x.py", PRISTINE["1.1.0"]["torch/x.py"], new_x))
    (hooks / "y" / "torch").mkdir(parents=True)
    (hooks / "y" / "torch" / "y.py.diff").write_text(_diff(
        "torch/y.py", PRISTINE["1.1.0"]["torch/y.py"], "def y(a, b=None):\n    return a + 1\n"))
    (hooks / "y" / "torch" / "y.py@1.0.0-1.0.0.diff").write_text(_diff(
        "torch/y.py", PRISTINE["1.0.0"]["torch/y.py"], "def y(a):\n    return a + 1\n",
        why="1.0.0's y() has no b."))
    (hooks / "old" / "torch").mkdir(parents=True)
    (hooks / "old" / "torch" / "x.py@1.0.0-1.0.0.diff").write_text(_diff(
        "torch/x.py", PRISTINE["1.0.0"]["torch/x.py"], PRISTINE["1.0.0"]["torch/x.py"].replace("X = 1", "X = 2"),
        why="Only 1.0.0 needs X = 2."))
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_core.py").write_text("def test_core():\n    pass\n")
    for version, files in PRISTINE.items():
        for rel, text in files.items():
            p = tmp_path / f"pristine-{version}" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    return fix


def _generate(fix: Path, **kw) -> list[str]:
    root = fix.parent
    return g.generate(cache_dir=root / "cache", patches_dir=root / "patches", fix=fix, tests_root=root,
                      pristine_for=lambda v: Pristine(tree=root / f"pristine-{v}"), out=lambda s: None, **kw)


def _patched(fix: Path, version: str) -> dict[str, str]:
    """Apply the generated series to a copy of the pristine tree."""
    root = fix.parent
    tree = root / f"applied-{version}"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(root / f"pristine-{version}", tree)
    patch_tree(root=tree, series=load_series(version, patches_dir=root / "patches"), include_tests=False)
    return {str(p.relative_to(tree)): p.read_text() for p in tree.rglob("*.py")}


def test_every_release_gets_its_stack_from_the_one_source(fix):
    assert _generate(fix) == []
    patches = fix.parent / "patches"
    s10 = [n for n in (patches / "v1.0.0" / "series").read_text().split() if n.endswith(".patch")]
    s11 = [n for n in (patches / "v1.1.0" / "series").read_text().split() if n.endswith(".patch")]
    assert s10 == ["0001-area-Do-the-old-thing.patch", "0002-area-Do-the-core-thing.patch",
                   "0003-area-Do-the-y-thing.patch"]
    assert s11 == ["0001-area-Do-the-core-thing.patch", "0002-area-Do-the-y-thing.patch"]
    for version in PRISTINE:
        files = _patched(fix, version)
        # the new module is byte-identical in every series; tests stay out of installs
        assert files["torch/_new.py"] == "def new():\n    return 'new'\n"
        assert "test/test_core.py" not in files
        assert "return new()" in files["torch/x.py"]
        assert "return a + 1" in files["torch/y.py"]
    assert "X = 2" in _patched(fix, "1.0.0")["torch/x.py"]
    # the tests travel inside the patch they test
    assert "b/test/test_core.py" in (patches / "v1.1.0" / s11[0]).read_text()


def test_overrides_are_named_in_the_message_and_the_readme(fix):
    _generate(fix)
    v10 = fix.parent / "patches" / "v1.0.0"
    y = (v10 / "0003-area-Do-the-y-thing.patch").read_text()
    assert "Differences from the 1.1.0 series (torch 1.0.0):" in y
    assert "torch/y.py: 1.0.0's y() has no b." in y
    readme = (v10 / "README.md").read_text()
    assert "`torch/y.py`: 1.0.0's y() has no b." in readme
    # the figure of lines added to existing files, per patch
    assert "| `0002-area-Do-the-core-thing.patch` | 3: `torch/x.py` 3 |" in readme
    assert "Applies-To: torch 1.0.0" in y
    # a patch's note, in every series it is part of
    assert "- `y`: kept opt-in: measured 2x." in readme
    assert "- `y`: kept opt-in: measured 2x." in (fix.parent / "patches" / "v1.1.0" / "README.md").read_text()


def test_regenerating_unchanged_source_changes_nothing(fix):
    _generate(fix)
    patches = fix.parent / "patches"
    before = {p: p.read_bytes() for p in patches.rglob("*") if p.is_file()}
    assert _generate(fix) == []
    assert {p: p.read_bytes() for p in patches.rglob("*") if p.is_file()} == before
    assert _generate(fix, check=True) == []


def test_one_edit_to_a_new_module_reaches_every_series_with_one_command(fix):
    _generate(fix)
    (fix / "src" / "torch" / "_new.py").write_text("def new():\n    return 'newer'\n")
    assert _generate(fix, check=True) == ["1.0.0", "1.1.0"]
    _generate(fix)
    for version in PRISTINE:
        assert _patched(fix, version)["torch/_new.py"] == "def new():\n    return 'newer'\n"


def test_check_finds_a_series_edited_by_hand(fix):
    _generate(fix)
    p = fix.parent / "patches" / "v1.1.0" / "0002-area-Do-the-y-thing.patch"
    p.write_text(p.read_text().replace("+    return a + 1", "+    return a + 2"))
    assert _generate(fix, check=True) == ["1.1.0"]


def test_a_hook_that_does_not_apply_names_the_override_to_write(fix):
    _generate(fix)
    patches = fix.parent / "patches"
    before = {p: p.read_bytes() for p in patches.rglob("*") if p.is_file()}
    (fix.parent / "pristine-1.1.0" / "torch" / "y.py").write_text("def y(c):\n    return c\n")
    with pytest.raises(OverlayError) as e:
        _generate(fix, versions=["1.1.0"])
    msg = str(e.value)
    assert "does not apply to torch 1.1.0's torch/y.py" in msg
    assert "y.py@<first>-<last>.diff" in msg
    assert {p: p.read_bytes() for p in patches.rglob("*") if p.is_file()} == before


def test_a_release_outside_the_stack_is_refused(fix):
    with pytest.raises(OverlayError, match="not a release of fix/stack.toml"):
        _generate(fix, versions=["9.9.9"])
