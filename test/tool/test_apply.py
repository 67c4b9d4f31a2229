"""apply / revert on a fake install made of real torch 2.15.0 files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import tree_digest
from torch_fork_overlay import state as st
from torch_fork_overlay.apply import apply_to_install, revert_install
from torch_fork_overlay.errors import OverlayError

DI = "torch-2.15.0.dist-info"


def _apply(sp, pdir):
    return apply_to_install(site_packages=sp, patches_dir=pdir, out=lambda s: None)


def _revert(sp, pdir):
    return revert_install(site_packages=sp, patches_dir=pdir, out=lambda s: None)


def test_round_trip_restores_files_and_record(fake_install, patches_dir):
    sp = fake_install
    before = tree_digest(sp)
    msg = _apply(sp, patches_dir)
    assert msg.startswith(
        "applied 2 patch(es) of the v2.15.0 series to torch 2.15.0+cu132 at "
        f"{sp / 'torch'}: 0001-guards-Mark-detect_fake_mode.patch, 0002-dynamo-Mark-config.patch"
    )
    guards = (sp / "torch/_guards.py").read_bytes()
    assert b"# fixture: patched by test/tool" in guards
    assert not (sp / "test").exists()  # the test-only patch is skipped for installs
    record = (sp / DI / "RECORD").read_bytes().decode()
    assert st.record_line("torch/_guards.py", guards) + "\r\n" in record
    state_bytes = (sp / "torch" / st.STATE_NAME).read_bytes()
    assert st.record_line("torch/_fork_overlay_state.json", state_bytes) in record
    backup = sp / "torch/_fork_overlay_backup/torch___guards.py.orig"
    assert st.record_line(backup.relative_to(sp).as_posix(), backup.read_bytes()) in record
    # idempotent
    assert _apply(sp, patches_dir).startswith("already applied: torch 2.15.0+cu132 at")
    assert tree_digest(sp) != before
    assert _revert(sp, patches_dir) == (
        f"reverted torch 2.15.0+cu132 at {sp / 'torch'} to pristine (2 file(s) restored, hash-checked)"
    )
    assert tree_digest(sp) == before


def test_no_series_for_release_lists_supported(fake_install, patches_dir):
    vpy = fake_install / "torch/version.py"
    vpy.write_text(vpy.read_text().replace("2.15.0+cu132", "2.16.0+cu132"))
    guards = fake_install / "torch/_guards.py"
    guards.write_text(guards.read_text() + "# as 2.16.0 would have it\n")  # else v2.15.0 serves it
    before = tree_digest(fake_install)
    with pytest.raises(OverlayError) as e:
        _apply(fake_install, patches_dir)
    assert str(e.value) == (
        f"error: no patch series for torch 2.16.0+cu132 at {fake_install / 'torch'} in {patches_dir}: "
        "no folder v2.16.0/, and no series' manifest matches its files (the sha256 of each file the "
        "series touches)\n"
        "  likely cause: torch 2.16.0+cu132 is not a supported release: this project supports torch "
        "2.15.0; another release is served only by a series whose touched files it has byte for byte\n"
        "  next: pip install torch==2.15.0, then rerun; or build a patched wheel of a supported release: "
        "python -m torch_fork_overlay wheel --version 2.15.0"
    )
    assert tree_digest(fake_install) == before


def test_file_modified_by_someone_else(fake_install, patches_dir):
    config = fake_install / "torch/_dynamo/config.py"
    config.write_text(config.read_text() + "# local edit\n")
    before = tree_digest(fake_install)
    with pytest.raises(OverlayError) as e:
        _apply(fake_install, patches_dir)
    assert str(e.value) == (
        f"error: cannot apply the v2.15.0 series to torch 2.15.0+cu132 at {fake_install / 'torch'}: "
        f"{config} is unknown; nothing was changed\n"
        "  likely cause: these files were modified by someone else (not pristine torch 2.15.0, "
        "not our patched result), or only part of the series is applied\n"
        "  next: reinstall pristine torch: pip install --force-reinstall --no-deps torch==2.15.0 (it replaces "
        "those files: keep a copy of any edit you need), "
        f"then rerun: python -m torch_fork_overlay apply --site-packages {fake_install}"
    )
    assert tree_digest(fake_install) == before


def test_patch_that_does_not_apply_mid_series(fake_install, patches_dir):
    p2 = patches_dir / "v2.15.0/0002-dynamo-Mark-config.patch"
    text = p2.read_text()
    p2.write_text(text.replace("\n import getpass\n", "\n import getpass_renamed\n", 1))
    before = tree_digest(fake_install)
    with pytest.raises(OverlayError) as e:
        _apply(fake_install, patches_dir)
    msg = re.sub(r"/tfo-stage-\w+", "/tfo-stage-XXX", str(e.value))
    msg = re.sub(r"(?m)^    .*\n", "", msg)  # git's own output lines
    assert msg == (
        f"error: patch 0002-dynamo-Mark-config.patch (2 of 2 in {patches_dir}/v2.15.0/series) "
        "does not apply to torch/_dynamo/config.py under "
        f"{Path('/tmp').resolve()}/tfo-stage-XXX; patches 0001-guards-Mark-detect_fake_mode.patch "
        "applied before it\n"
        f"  (applied to a staging copy; nothing in {fake_install} was changed)\n"
        "  likely cause: the files are not torch 2.15.0 plus the earlier patches of the series, "
        "or the patch was generated against another base\n"
        "  next: regenerate the patch from an edited tree: python -m torch_fork_overlay refresh --help"
    )
    assert "patch failed: torch/_dynamo/config.py" in str(e.value)
    assert tree_digest(fake_install) == before


def _chattr(path: Path, flag: str) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_read_only_install(fake_install, patches_dir):
    # As root os.access() says yes to everything; an immutable directory
    # (chattr +i) refuses even root, like a read-only mount does.
    torch_dir = fake_install / "torch"
    if shutil.which("chattr") is None or not _chattr(torch_dir, "+i"):
        pytest.skip("chattr +i not supported here")
    try:
        before = tree_digest(fake_install)
        with pytest.raises(OverlayError) as e:
            _apply(fake_install, patches_dir)
        assert tree_digest(fake_install) == before
    finally:
        _chattr(torch_dir, "-i")
    assert str(e.value) == (
        f"error: cannot write to {torch_dir} (Operation not permitted) while patching "
        f"torch 2.15.0+cu132 at {torch_dir}; nothing was changed\n"
        "  likely cause: the install is read-only: a system or shared site-packages, an immutable "
        "directory, a read-only mount, or owned by another user\n"
        "  next: rerun as the owner of that environment, or install a patched wheel into your own "
        "venv: python -m torch_fork_overlay wheel --version 2.15.0"
    )


def test_patch_adding_a_new_directory(fake_install, patches_dir, stock_site_packages, tmp_path):
    # A series may add a file in a directory torch does not have: the
    # writability check probes the directory that will hold the new one, and
    # revert removes both.
    from torch_fork_overlay import refresh

    tree, msg = tmp_path / "tree", tmp_path / "msg"
    (tree / "torch/_fixture_pkg").mkdir(parents=True)
    (tree / "torch/_fixture_pkg/new.py").write_text("# fixture: a new module\n")
    msg.write_text("fixture: Add a module in a new directory\n\nFor the tool's tests.\n")
    refresh.new_patch(version="2.15.0", pristine=refresh.Pristine(tree=stock_site_packages),
                      tree=tree, files=["torch/_fixture_pkg/new.py"], message_file=msg,
                      patches_dir=patches_dir)
    before = tree_digest(fake_install)
    assert _apply(fake_install, patches_dir).startswith("applied 3 patch(es)")
    assert (fake_install / "torch/_fixture_pkg/new.py").read_text() == "# fixture: a new module\n"
    _revert(fake_install, patches_dir)
    assert not (fake_install / "torch/_fixture_pkg").exists()
    assert tree_digest(fake_install) == before


def test_patch_path_escaping_root(fake_install, patches_dir):
    p1 = patches_dir / "v2.15.0/0001-guards-Mark-detect_fake_mode.patch"
    p1.write_text(p1.read_text().replace("a/torch/_guards.py b/torch/_guards.py",
                                         "a/../evil.py b/../evil.py"))
    before = tree_digest(fake_install)
    with pytest.raises(OverlayError) as e:
        _apply(fake_install, patches_dir)
    assert str(e.value) == (
        "error: patch 0001-guards-Mark-detect_fake_mode.patch touches '../evil.py', which escapes "
        "the tree it applies to\n"
        "  likely cause: the patch was written by hand or with the wrong -p level; patch paths must "
        "be relative to the PyTorch repository root\n"
        "  next: regenerate it with: python -m torch_fork_overlay refresh --help"
    )
    assert tree_digest(fake_install) == before
    assert not (fake_install.parent / "evil.py").exists()


def test_revert_with_nothing_applied(fake_install, patches_dir):
    before = tree_digest(fake_install)
    with pytest.raises(OverlayError) as e:
        _revert(fake_install, patches_dir)
    assert str(e.value) == (
        f"error: nothing to revert: torch 2.15.0+cu132 at {fake_install / 'torch'} has no "
        "_fork_overlay_state.json, so torch_fork_overlay never applied a series there\n"
        "  likely cause: it was never patched, was already reverted, or is a patched wheel "
        "(which is undone by reinstalling torch, not by revert)\n"
        "  next: see what is installed: python -m torch_fork_overlay status "
        f"--site-packages {fake_install}"
    )
    assert tree_digest(fake_install) == before


def test_revert_refuses_file_edited_after_apply(fake_install, patches_dir):
    _apply(fake_install, patches_dir)
    guards = fake_install / "torch/_guards.py"
    guards.write_text(guards.read_text() + "# edited after apply\n")
    before = tree_digest(fake_install)
    with pytest.raises(OverlayError, match=r"cannot revert .*_guards.py is unknown; nothing was changed"):
        _revert(fake_install, patches_dir)
    assert tree_digest(fake_install) == before


def test_stale_manifest_is_caught_before_any_change(fake_install, patches_dir):
    m = patches_dir / "v2.15.0/manifest.json"
    m.write_text(re.sub(r'"patched": "[0-9a-f]{4}', '"patched": "0000', m.read_text(), count=1))
    before = tree_digest(fake_install)
    with pytest.raises(OverlayError, match=r"expects 0000.*nothing was changed\n  likely cause: the manifest is stale"):
        _apply(fake_install, patches_dir)
    assert tree_digest(fake_install) == before


def test_apply_rolls_back_when_a_write_fails_after_the_checks(fake_install, patches_dir):
    # The state file's temp file path is a directory: every check passes,
    # backups and patched files are moved in, then writing the state fails.
    tmp = st.temp_path(fake_install / "torch" / st.STATE_NAME)
    tmp.mkdir()
    before = tree_digest(fake_install)
    with pytest.raises(OverlayError) as e:
        _apply(fake_install, patches_dir)
    assert str(e.value).startswith(
        f"error: could not write {tmp} (Is a directory) while "
        "applying the v2.15.0 series to torch 2.15.0+cu132 at "
        f"{fake_install / 'torch'}; everything was rolled back, nothing was changed\n"
    )
    assert tree_digest(fake_install) == before
