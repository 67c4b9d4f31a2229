"""``export``: git am of the series onto a real git checkout built from the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _checkout_helpers import (  # noqa: E402
    GIT_ENV,
    TEST_FILE,
    TOUCHED,
    git,
    make_checkout,
    make_series,
    sha,
    snapshot,
)

from torch_fork_overlay.errors import OverlayError  # noqa: E402
from torch_fork_overlay.export import export, filter_patch, strip_project_trailers  # noqa: E402


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    repo = make_checkout(base / "pytorch")
    patches = base / "patches"
    make_series(repo, patches, base)
    return repo, patches


@pytest.fixture
def repo(pristine, tmp_path, monkeypatch):
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)
    dest = tmp_path / "pytorch"
    subprocess.run(["cp", "-a", str(pristine[0]), str(dest)], check=True)
    return dest


@pytest.fixture
def patches(pristine):
    return pristine[1]


def _export(repo, patches, **kw):
    lines = []
    res = export(pytorch_src=repo, patches_dir=patches, echo=lines.append, **kw)
    return res, "\n".join(lines)


def test_export_commits_series_with_pr_messages(repo, patches):
    res, out = _export(repo, patches)
    assert res.branch == "torch-fork-overlay/fakemode-v2.15.0"
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip() == res.branch
    assert git(repo, "rev-parse", f"{res.branch}~2").stdout.strip() == git(repo, "rev-parse", "v2.15.0").stdout.strip()
    assert len(res.commits) == 2
    # the tree is the patched one: manifest hash, and the test placed where upstream keeps it
    manifest = (patches / "v2.15.0" / "manifest.json").read_text()
    assert sha(repo / TOUCHED) in manifest
    assert (repo / TEST_FILE).is_file()
    assert git(repo, "status", "--porcelain").stdout == ""
    msgs = git(repo, "log", "--format=%B%x00", "v2.15.0..HEAD").stdout
    for trailer in ("Applies-To:", "Forwarded:", "Last-Update:"):
        assert trailer not in msgs
    assert "Problem: a probe message" in msgs
    assert msgs.count(f"Test Plan:\n    python {TEST_FILE}") == 2
    assert "Fixes #" not in msgs
    assert "[PATCH" not in msgs
    assert "ghstack submit" in out and "none of these were run" in out
    assert git(repo, "remote").stdout == ""  # nothing pushed anywhere


def test_export_onto_main_uses_three_way(repo, patches):
    (repo / "version.txt").write_text("2.16.0a0\n")
    git(repo, "commit", "-q", "-am", "Bump version to 2.16.0a0")
    res, _ = _export(repo, patches, base="main", branch="fakemode")
    assert res.base == "main" and len(res.commits) == 2
    assert (repo / TEST_FILE).is_file()


def test_not_a_git_checkout(repo, patches):
    shutil.rmtree(repo / ".git")
    before = sorted(p.name for p in repo.iterdir())
    with pytest.raises(OverlayError) as e:
        _export(repo, patches)
    assert "is not a git checkout" in e.value.what
    assert "git clone" in e.value.next
    assert sorted(p.name for p in repo.iterdir()) == before


def test_not_a_pytorch_tree(tmp_path, patches):
    with pytest.raises(OverlayError) as e:
        _export(tmp_path, patches)
    assert "is not a PyTorch source checkout" in e.value.what


def test_dirty_tree(repo, patches):
    with open(repo / TOUCHED, "a") as f:
        f.write("# local edit\n")
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches)
    assert f"has uncommitted changes: {TOUCHED}" in e.value.what
    assert "git -C" in e.value.next and "stash" in e.value.next
    assert snapshot(repo) == before


def test_untracked_file_the_series_creates(repo, patches):
    (repo / TEST_FILE).write_text("# left over\n")
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches)
    assert "untracked files the series would create" in e.value.what
    assert snapshot(repo) == before


def test_checkout_of_another_release(repo, patches):
    (repo / "version.txt").write_text("2.14.1a0\n")
    git(repo, "commit", "-q", "-am", "2.14.1")
    git(repo, "tag", "-d", "v2.15.0")
    git(repo, "tag", "v2.14.1")
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches)
    assert "is torch 2.14.1a0 (version.txt), not the v2.15.0 it is exported onto" in e.value.what
    assert "checkout v2.15.0" in e.value.next
    assert snapshot(repo) == before


def test_head_past_the_tag(repo, patches):
    (repo / "README").write_text("x\n")
    git(repo, "add", "README")
    git(repo, "commit", "-q", "-m", "later work")
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches)
    assert "not the v2.15.0 tag" in e.value.what
    assert snapshot(repo) == before


def test_touched_file_differs_without_tag(repo, patches):
    git(repo, "tag", "-d", "v2.15.0")
    with open(repo / TOUCHED, "a") as f:
        f.write("# someone else's commit\n")
    git(repo, "commit", "-q", "-am", "edit")
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches)
    assert f"{TOUCHED} (modified)" in e.value.what
    assert snapshot(repo) == before


def test_base_main_on_a_release(repo, patches):
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches, base="main")
    assert "not main" in e.value.what
    assert snapshot(repo) == before


def test_unsupported_base(repo, patches):
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches, base="v2.13.0")
    assert e.value.what == (
        f"no patch series for torch 2.13.0 in {patches}: there is no v2.13.0/, and {repo} is torch "
        "2.15.0a0 (version.txt), not 2.13.0, so its files cannot show which series would serve 2.13.0")
    assert "this project supports torch 2.15.0;" in e.value.cause
    assert snapshot(repo) == before


def _as_release(repo, release):
    """The checkout as a release whose touched files are 2.15.0's bytes."""
    (repo / "version.txt").write_text(f"{release}a0\n")
    git(repo, "commit", "-q", "-am", f"torch {release}")
    git(repo, "tag", f"v{release}")


def test_base_without_folder_served_by_hashes(repo, patches):
    _as_release(repo, "2.15.1")
    res, out = _export(repo, patches, base="v2.15.1")
    assert (res.base, res.branch) == ("v2.15.1", "torch-fork-overlay/fakemode-v2.15.1")
    assert len(res.commits) == 2
    assert git(repo, "rev-parse", f"{res.branch}~2").stdout == git(repo, "rev-parse", "v2.15.1").stdout


def test_base_without_folder_and_other_bytes_refused(repo, patches):
    with open(repo / TOUCHED, "a") as f:
        f.write("# as 2.15.1 has it\n")
    _as_release(repo, "2.15.1")
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches, base="v2.15.1")
    assert e.value.what.startswith(f"no patch series for {repo}, torch 2.15.1a0 (version.txt, --base v2.15.1) "
                                   f"in {patches}: no folder v2.15.1/, and no series' manifest matches its files")
    assert e.value.next == (f"export a supported release instead: git -C {repo} checkout v2.15.0, then "
                            f"python -m torch_fork_overlay export --pytorch-src {repo} --base v2.15.0")
    assert snapshot(repo) == before


def test_branch_exists(repo, patches):
    git(repo, "branch", "torch-fork-overlay/fakemode-v2.15.0")
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches)
    assert "already exists" in e.value.what
    assert snapshot(repo) == before


def test_git_am_conflict_restores_everything(repo, patches):
    text = (repo / TOUCHED).read_text()
    anchor = "def detect_fake_mode(inputs: Any = None) -> FakeTensorMode | None:\n"
    (repo / TOUCHED).write_text(text.replace(anchor, "# upstream moved on\n" + anchor, 1))
    (repo / "version.txt").write_text("2.16.0a0\n")
    git(repo, "commit", "-q", "-am", "main moves on")
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches, base="main")
    assert "git am of the v2.15.0 series onto main" in e.value.what
    assert "failed at 0001-" in e.value.what and "(patch 1 of 2)" in e.value.what
    assert "rebasing" in e.value.cause
    assert snapshot(repo) == before
    assert not (Path(git(repo, "rev-parse", "--absolute-git-dir").stdout.strip()) / "rebase-apply").exists()


def test_strip_project_trailers_keeps_others():
    body = ["Summary", "", "Fixes #123", "", "Applies-To: torch 2.15.0", "Forwarded: yes,", "  continued",
            "Signed-off-by: A <a@b>", "Last-Update: 2026-01-01"]
    assert strip_project_trailers(body) == ["Summary", "", "Fixes #123", "", "Signed-off-by: A <a@b>"]
    # prose that merely looks like a trailer mid-message is left alone
    assert strip_project_trailers(["Forwarded: in prose", "", "end."]) == ["Forwarded: in prose", "", "end."]


def test_filter_patch_keeps_existing_test_plan():
    mail = "From 0\nSubject: [PATCH] x\n\nBody\n\nTest Plan:\n    pytest a.py\n\nApplies-To: torch 2.15.0\n---\n diff\n"
    out = filter_patch(mail, test_plan=["python test/b.py"])
    assert "python test/b.py" not in out and "Applies-To" not in out
    assert out.endswith("Test Plan:\n    pytest a.py\n\n---\n diff\n")


def test_export_shipped_series(repo):
    """The project's real patches/v2.15.0 applies with git am to the release's files."""
    from torch_fork_overlay.series import load_series

    series = load_series("2.15.0")
    lines = []
    res = export(pytorch_src=repo, echo=lines.append)
    assert len(res.commits) == len(series.patches)
    msgs = git(repo, "log", "--format=%B", "v2.15.0..HEAD").stdout
    for trailer in ("Applies-To:", "Forwarded:", "Last-Update:"):
        assert trailer not in msgs
    for rel, hashes in series.manifest.items():
        assert sha(repo / rel) == hashes["patched"], rel
    # the exporter, not the project's placeholder identity, authors the PR commits
    assert set(git(repo, "log", "--format=%an <%ae>", "v2.15.0..HEAD").stdout.split("\n")[:-1]) == {
        "Test Author <author@example.com>"}


def test_export_keep_author(repo):
    from torch_fork_overlay.series import load_series

    first = load_series("2.15.0").patches[0].path.read_text()
    author = next(l for l in first.splitlines() if l.startswith("From: "))[6:]
    res, _ = _export(repo, None, keep_author=True)
    assert git(repo, "log", "--format=%an <%ae>", "-1", f"v2.15.0..{res.branch}~{len(res.commits) - 1}").stdout.strip() == author


def test_cli_export_error_changes_nothing(repo):
    with open(repo / TOUCHED, "a") as f:
        f.write("# dirty\n")
    before = snapshot(repo)
    cp = subprocess.run([sys.executable, "-m", "torch_fork_overlay", "export", "--pytorch-src", str(repo)],
                        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert cp.returncode == 2
    assert cp.stderr.startswith(f"error: {repo} has uncommitted changes: {TOUCHED}\n  likely cause:")
    assert "\n  next: git -C" in cp.stderr and "Traceback" not in cp.stderr
    assert snapshot(repo) == before


def test_export_twice_says_already_committed(repo, patches):
    res, _ = _export(repo, patches)
    before = snapshot(repo)
    with pytest.raises(OverlayError) as e:
        _export(repo, patches, branch="again")
    assert "series is already committed at HEAD" in e.value.what
    assert snapshot(repo) == before


def test_base_that_is_not_a_tag(repo, patches):
    with pytest.raises(OverlayError) as e:
        _export(repo, patches, base="origin/main")
    assert "--base origin/main is neither a release tag nor main" in e.value.what


def test_set_author_replaces_folded_from_header():
    from torch_fork_overlay.export import set_author

    headers = ["From 0000 Mon Sep 17 00:00:00 2001", "From: =?UTF-8?q?A?=", " <a@b>", "Date: x", "Subject: y"]
    assert set_author(headers, "Me <me@x>") == ["From 0000 Mon Sep 17 00:00:00 2001", "From: Me <me@x>",
                                                 "Date: x", "Subject: y"]
