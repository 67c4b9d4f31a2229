"""Build PyTorch-shaped git checkouts and small series at test time.

Nothing here is committed PyTorch source: the checkout is extracted from the
official wheel (``torch/**/*.py``) into a tmp dir, with a ``version.txt`` as a
release tag has it, and committed + tagged so ``git am`` really runs.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = "2.15.0"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_COMMITTER_NAME": "Test Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.com",
    "GIT_AUTHOR_DATE": "2026-11-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-11-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}

TOUCHED = "torch/_guards.py"
ANCHOR = "def detect_fake_mode(inputs: Any = None) -> FakeTensorMode | None:\n"
TEST_FILE = "test/dynamo/test_tfo_export_probe.py"

PATCH_MESSAGE = """\
[dynamo] Mark where torch.compile looks for the ambient FakeTensorMode

Problem: a probe message standing in for the PR text.

Fix: add a comment above detect_fake_mode.

Alternatives considered: none, this is a test fixture.

Applies-To: torch 2.15.0
Forwarded: not-needed
Last-Update: 2026-11-29
"""

TEST_MESSAGE = """\
[dynamo] Add a probe test for the ambient FakeTensorMode note

The test file travels as its own patch, as upstream tests do.

Applies-To: torch 2.15.0
Forwarded: not-needed
"""

TEST_SOURCE = '''\
# Owner(s): ["module: dynamo"]
import unittest


class ProbeTests(unittest.TestCase):
    def test_probe(self):
        self.assertTrue(True)


if __name__ == "__main__":
    unittest.main()
'''


def git(cwd, *args, check=True):
    return subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, check=check, capture_output=True, text=True
    )


def find_wheel() -> Path:
    cands = [os.environ.get("TORCH_FORK_OVERLAY_WHEEL", ""), os.environ.get("TORCH_FORK_OVERLAY_TEST_WHEEL", "")]
    for d in (REPO / ".cache", Path("/work/cache/wheels")):
        cands += sorted(glob.glob(str(d / "**" / f"torch-{VERSION}-*.whl"), recursive=True))
    for c in cands:
        if c and Path(c).is_file():
            return Path(c)
    pytest.skip(f"no official torch {VERSION} wheel found (set TORCH_FORK_OVERLAY_WHEEL)")


def extract_py(wheel: Path, dest: Path, *, only: list[str] | None = None) -> None:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            n = info.filename
            if n.startswith("torch/") and n.endswith(".py") and (only is None or n in only):
                z.extract(info, dest)


def make_checkout(dest: Path, *, wheel: Path | None = None, version_txt: str = f"{VERSION}a0",
                  only: list[str] | None = None, tag: str | None = f"v{VERSION}") -> Path:
    """A git repo laid out like a PyTorch checkout at a release tag."""
    dest.mkdir(parents=True)
    extract_py(wheel or find_wheel(), dest, only=only)
    (dest / "version.txt").write_text(version_txt + "\n")
    (dest / "setup.py").write_text("raise SystemExit('fake PyTorch setup.py: not for running')\n")
    (dest / "test" / "dynamo").mkdir(parents=True)
    (dest / "test" / "dynamo" / "__init__.py").write_text("")
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"torch {version_txt} python files from the official wheel")
    if tag:
        git(dest, "tag", tag)
    return dest


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def make_series(checkout: Path, patches_dir: Path, work: Path) -> Path:
    """Author a two-patch series (code + upstream test) with git format-patch."""
    clone = work / "author"
    git(work, "clone", "-q", str(checkout), str(clone))
    target = clone / TOUCHED
    pristine = sha(target)
    text = target.read_text()
    assert ANCHOR in text
    target.write_text(text.replace(ANCHOR, "# See Note [Inheriting the ambient FakeTensorMode]\n" + ANCHOR, 1))
    git(clone, "commit", "-q", "-a", "-m", PATCH_MESSAGE)
    (clone / TEST_FILE).write_text(TEST_SOURCE)
    git(clone, "add", TEST_FILE)
    git(clone, "commit", "-q", "-m", TEST_MESSAGE)
    out = patches_dir / f"v{VERSION}"
    git(clone, "format-patch", "-q", "--zero-commit", "--no-signature", "-N", "-o", str(out), "HEAD~2..HEAD")
    names = sorted(p.name for p in out.glob("*.patch"))
    (out / "series").write_text("# test series\n" + "\n".join(names) + "\n")
    (out / "manifest.json").write_text(json.dumps(
        {"torch": VERSION, "files": {TOUCHED: {"pristine": pristine, "patched": sha(target)}}}, indent=2))
    shutil.rmtree(clone)
    return out


def snapshot(repo: Path) -> tuple[str, str, str, str]:
    """(HEAD sha, HEAD ref, branches, status) -- what 'changed nothing' compares."""
    return (
        git(repo, "rev-parse", "HEAD").stdout,
        git(repo, "rev-parse", "--abbrev-ref", "HEAD").stdout,
        git(repo, "branch", "--list", "--format=%(refname)").stdout,
        git(repo, "status", "--porcelain", "--untracked-files=all").stdout,
    )
