"""Clear errors instead of tracebacks, and no misleading answers (issue 10,
cases 3, 5, 7, 8), on the synthetic install: every failure exits 2 with the
three-part message and leaves the install as it was."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SYNTH_DIST_INFO, run_cli, tree_digest
from torch_fork_overlay import state as st
from test_crash_safety import assert_record_matches_files


def _args(sp: Path, pdir: Path) -> list[str]:
    return ["--site-packages", str(sp), "--patches-dir", str(pdir)]


def _fails(cmd: str, *args: str, **kw) -> str:
    cp = run_cli(cmd, *args, **kw)
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert "Traceback" not in cp.stderr, cp.stderr
    assert re.fullmatch(r"error: .*\n  likely cause: .*\n  next: .*\n", cp.stderr, re.S), cp.stderr
    return cp.stderr


# -- 7: tracebacks -> clear errors --------------------------------------------

@pytest.mark.parametrize("python, said", [
    ("/bin/true", "did not answer like a Python interpreter (it printed nothing)"),
    ("/bin/echo", "did not answer like a Python interpreter (it printed \"-c import importlib.util"),
    ("DIR", "is not an executable file"),
])
def test_python_that_is_not_an_interpreter(tmp_path, python, said):
    python = str(tmp_path) if python == "DIR" else python
    if not os.path.exists(python):
        pytest.skip(f"no {python}")
    for cmd in ("status", "apply", "revert"):
        err = _fails(cmd, "--python", python)
        assert err.startswith(f"error: --python {python} {said}"), err


def test_corrupt_state_file(synth):
    sp, pdir = synth
    assert run_cli("apply", *_args(sp, pdir)).returncode == 0
    state = sp / "torch" / st.STATE_NAME
    state.write_bytes(state.read_bytes()[:100])
    before = tree_digest(sp)
    for cmd in ("apply", "revert"):
        err = _fails(cmd, *_args(sp, pdir))
        assert err.startswith(f"error: cannot read the state file {state} (not valid JSON: "), err
        assert err.endswith("next: reinstall pristine torch, which also removes it (it is listed in "
                            "RECORD): pip install --force-reinstall --no-deps torch==2.15.0\n")
    cp = run_cli("status", *_args(sp, pdir))
    assert cp.returncode == 0 and f"state file:    cannot read the state file {state}" in cp.stdout
    assert tree_digest(sp) == before


def test_manifest_entry_without_pristine(synth):
    sp, pdir = synth
    m = pdir / "v2.15.0/manifest.json"
    data = json.loads(m.read_text())
    del data["files"]["torch/_guards.py"]["pristine"]
    m.write_text(json.dumps(data))
    before = tree_digest(sp)
    err = _fails("apply", *_args(sp, pdir))
    assert err.startswith(f"error: {m} is not a valid manifest (the entry of torch/_guards.py must "
                          "have exactly 'pristine' and 'patched', not {'patched': "), err
    assert tree_digest(sp) == before


def test_non_utf8_byte_in_a_patch(synth):
    sp, pdir = synth
    p = pdir / "v2.15.0/0001-area-Synthetic-patch-1.patch"
    p.write_bytes(p.read_bytes().replace(b"patched by test/tool", b"patched by test/t\xffol"))
    before = tree_digest(sp)
    for cmd in ("apply", "status"):
        cp = run_cli(cmd, *_args(sp, pdir))
        assert "Traceback" not in cp.stderr
    err = _fails("apply", *_args(sp, pdir))
    line = p.read_bytes()[: p.read_bytes().index(b"\xff")].count(b"\n") + 1
    assert err.startswith(f"error: patch {p} is not UTF-8 text: byte 0xff at line {line}\n"), err
    assert tree_digest(sp) == before


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    cp = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    return cp.returncode == 0


needs_tmpfs = pytest.mark.skipif(not _unshare_works(),
                                 reason="needs unshare --user --mount (for a small tmpfs)")


def _with_full_tmpfs(tmp_path: Path, script: str, *, free_kb: int, prepare: str = "true") -> None:
    """Run ``script`` (sh) in a user+mount namespace with a 512 KiB tmpfs at
    $FULL, after ``prepare``, filled up to ``free_kb`` KiB free; $PY is this interpreter."""
    full = tmp_path / "full"
    full.mkdir()
    sh = (f'mount -t tmpfs -o size=512k none "$FULL" && {prepare} && dd if=/dev/zero of="$FULL/gap" '
          f'bs=1k count={free_kb} 2>/dev/null && (dd if=/dev/zero of="$FULL/fill" bs=4k 2>/dev/null; '
          f'rm "$FULL/gap"; {script})')
    env = {**os.environ, "FULL": str(full), "PY": sys.executable}
    env.pop("TMPDIR", None)
    cp = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", sh],
                        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True)
    assert cp.returncode == 0, (cp.stdout, cp.stderr)


@needs_tmpfs
def test_tmpdir_on_a_full_disk(tmp_path, synth):
    sp, pdir = synth
    before = tree_digest(sp)
    out = tmp_path / "out"
    _with_full_tmpfs(tmp_path, f'TMPDIR="$FULL" "$PY" -m torch_fork_overlay apply {" ".join(_args(sp, pdir))} '
                     f'>"{out}.stdout" 2>"{out}.stderr"; echo $? >"{out}.rc"', free_kb=8)
    err = Path(f"{out}.stderr").read_text()
    assert Path(f"{out}.rc").read_text().strip() == "2", err
    assert err.startswith(f"error: cannot prepare the patched files in a staging folder under "
                          f"{tmp_path / 'full'} (No space left on device"), err
    assert "Traceback" not in err
    assert tree_digest(sp) == before


@needs_tmpfs
def test_install_on_a_full_disk(tmp_path, synth):
    """5: a full disk is found before anything changes (no partial temp
    file, no backup dir); the injected-ENOSPC matrix covers a disk that fills
    up during the run (test_crash_safety.test_disk_full_at_every_step)."""
    sp, pdir = synth
    out = tmp_path / "out"
    _with_full_tmpfs(tmp_path, f'"$PY" -m torch_fork_overlay apply --site-packages "$FULL/sp" '
                     f'--patches-dir "{pdir}" >"{out}.stdout" 2>"{out}.stderr"; echo $? >"{out}.rc"; '
                     f'cp -a "$FULL/sp" "{out}.sp"', free_kb=40, prepare=f'cp -a "{sp}" "$FULL/sp"')
    err = Path(f"{out}.stderr").read_text()
    assert Path(f"{out}.rc").read_text().strip() == "2", err
    assert re.match(r"error: not enough free space to patch torch 2.15.0\+cu132 at \S+/sp/torch: "
                    r"\d+ bytes needed in \S+/sp/torch, \d+ free; nothing was changed\n", err), err
    assert tree_digest(Path(f"{out}.sp")) == tree_digest(sp)


# -- 3: the reinstall command resolves ---------------------------------------

def test_reinstall_command_names_the_public_version(synth):
    sp, pdir = synth
    g = sp / "torch/_guards.py"
    g.write_text(g.read_text() + "# local edit\n")
    err = _fails("apply", *_args(sp, pdir))
    assert "pip install --force-reinstall --no-deps torch==2.15.0 (it replaces those files" in err
    assert "torch==2.15.0+cu132" not in err


# -- 8: misleading answers ---------------------------------------------------

def test_wrong_pristine_hash_in_the_manifest_is_blamed_on_the_manifest(synth):
    sp, pdir = synth
    m = pdir / "v2.15.0/manifest.json"
    data = json.loads(m.read_text())
    data["files"]["torch/_guards.py"]["pristine"] = "0" * 64
    m.write_text(json.dumps(data))
    before = tree_digest(sp)
    err = _fails("apply", *_args(sp, pdir))
    assert err == (
        f"error: cannot apply the v2.15.0 series to torch 2.15.0+cu132 at {sp / 'torch'}: "
        f"{sp / 'torch/_guards.py'} is exactly as pip installed it (matching "
        f"{sp / SYNTH_DIST_INFO / 'RECORD'}) but not the pristine sha256 in {m}; nothing was changed\n"
        "  likely cause: the manifest does not describe this build of torch 2.15.0+cu132 "
        "(git synthetic0123456789): it is wrong, or the series was made from another build\n"
        "  next: rewrite the manifest from this install and review the diff: python -m "
        f"torch_fork_overlay refresh --manifest-only --version 2.15.0 --pristine {sp}\n"
    )
    assert tree_digest(sp) == before


def test_empty_series_is_not_already_applied(synth):
    sp, pdir = synth
    (pdir / "v2.15.0/series").write_text("# nothing yet\n0003-test-Add-a-synthetic-test.patch\n")
    err = _fails("apply", *_args(sp, pdir))
    assert err.startswith(f"error: the v2.15.0 series in {pdir / 'v2.15.0'} has no patch to apply "
                          "to an install (1 listed in"), err


def _stale_dist_info(sp: Path, name: str, *, same: bool) -> Path:
    di = sp / name
    shutil.copytree(sp / SYNTH_DIST_INFO, di)
    if not same:  # an older torch's RECORD: other hashes for torch/__init__.py and version.py
        text = (di / "RECORD").read_text()
        text = re.sub(r"(torch/(?:__init__|version)\.py,sha256=)\S+?,", r"\1stale,", text)
        (di / "RECORD").write_text(text)
    return di


def test_two_dist_infos_the_matching_one_is_edited(synth):
    sp, pdir = synth
    stale = _stale_dist_info(sp, "torch-2.14.0.dist-info", same=False)  # sorts first
    stale_before = tree_digest(stale)
    cp = run_cli("apply", *_args(sp, pdir))
    assert cp.returncode == 0, cp.stderr
    assert "torch/_fork_overlay_state.json" in (sp / SYNTH_DIST_INFO / "RECORD").read_text()
    assert tree_digest(stale) == stale_before
    cp = run_cli("status", *_args(sp, pdir))
    assert f"dist-info:     {sp / SYNTH_DIST_INFO}\n" in cp.stdout


def test_two_matching_dist_infos_are_refused(synth):
    sp, pdir = synth
    _stale_dist_info(sp, "torch-2.15.0.post0.dist-info", same=True)
    before = tree_digest(sp)
    err = _fails("apply", *_args(sp, pdir))
    assert err.startswith(f"error: 2 torch dist-info folders in {sp} (torch-2.15.0.dist-info, "
                          "torch-2.15.0.post0.dist-info) and more than one of them lists"), err
    assert tree_digest(sp) == before


def test_symlinked_torch_with_python_updates_record(tmp_path, synth):
    sp, pdir = synth
    real = tmp_path / "elsewhere"
    real.mkdir()
    shutil.move(sp / "torch", real / "torch")
    (sp / "torch").symlink_to(real / "torch", target_is_directory=True)
    record = sp / SYNTH_DIST_INFO / "RECORD"
    before = record.read_bytes(), tree_digest(real)
    env = {**os.environ, "PYTHONPATH": str(sp)}
    args = ["--python", sys.executable, "--patches-dir", str(pdir)]
    cp = run_cli("apply", *args, env=env)
    assert cp.returncode == 0, cp.stderr
    assert f"to torch 2.15.0+cu132 at {sp / 'torch'}:" in cp.stdout
    assert "torch/_fork_overlay_state.json" in record.read_text()
    assert_record_matches_files(sp)
    cp = run_cli("revert", *args, env=env)
    assert cp.returncode == 0, cp.stderr
    assert (record.read_bytes(), tree_digest(real)) == before


def test_partly_undone_apply_points_at_revert(synth):
    sp, pdir = synth
    pristine_guards = (sp / "torch/_guards.py").read_bytes()
    assert run_cli("apply", *_args(sp, pdir)).returncode == 0
    (sp / "torch/_guards.py").write_bytes(pristine_guards)  # undone by hand
    err = _fails("apply", *_args(sp, pdir))
    assert err.startswith(f"error: cannot apply the v2.15.0 series to torch 2.15.0+cu132 at {sp / 'torch'}: "
                          f"{sp / 'torch/_dynamo/config.py'} already has the patched content"), err
    assert err.endswith(f"next: undo it from its backups, then apply: python -m torch_fork_overlay revert "
                        f"--site-packages {sp} && python -m torch_fork_overlay apply --site-packages {sp}\n")
    assert run_cli("revert", *_args(sp, pdir)).returncode == 0
    assert run_cli("apply", *_args(sp, pdir)).returncode == 0
    assert_record_matches_files(sp)


# -- issue 20, point 1: no next line advises deleting or overwriting a file the tool did not create --

_DESTRUCTIVE = re.compile(r"\b(delete|rm|remove|overwrite|unlink)\b|checkout -- |clean -\w*f|branch -D|reset --hard")
# (module, words of the advice): why it is safe
_SAFE = {
    ("series.py", "git checkout -- "): "the listed patch file is missing: restoring it from git overwrites "
    "nothing, and the other choice removes a line of the series file, not a file",
}


def _next_texts():
    """Every ``next=`` argument in the package, its string parts joined ({...} for the f-string holes)."""
    import ast

    pkg = Path(__file__).resolve().parents[2] / "torch_fork_overlay"
    for path in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for kw in getattr(node, "keywords", ()):
                if kw.arg == "next":
                    parts = ["{}" if isinstance(n, ast.FormattedValue) else n.value for n in ast.walk(kw.value)
                             if isinstance(n, ast.FormattedValue) or isinstance(getattr(n, "value", None), str)]
                    yield path.name, node.lineno, "".join(parts)


def test_no_next_line_advises_deleting_a_file_the_tool_did_not_create():
    texts = list(_next_texts())
    assert len(texts) > 90  # every module's errors were read
    bad = [(name, line, text) for name, line, text in texts
           if (m := _DESTRUCTIVE.search(text)) and "tool's own" not in text
           and not any(name == n and words in text for n, words in _SAFE)]
    assert bad == []


def test_bootstrap_stops_before_a_venv_the_disk_cannot_hold(tmp_path):
    """tools/bootstrap checks the free space before each download (a CI run on
    a nearly full disk used to fail deep inside pip or a test)."""
    root = tmp_path / "repo"
    (root / "tools").mkdir(parents=True)
    shutil.copy(Path(__file__).parents[2] / "tools" / "bootstrap", root / "tools" / "bootstrap")
    (root / "requirements.txt").write_text("torch==2.15.0\n")
    (root / "requirements-dev.txt").write_text("pytest\n")
    (root / ".venv-stock").mkdir()  # a stale venv: replaced, so its space counts as free
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "df").write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                                "echo '/dev/x 100000000 97000000 3000000 97% /'\n")  # 2.86 GB free
    (bin_dir / "df").chmod(0o755)
    cp = subprocess.run([str(root / "tools" / "bootstrap")], capture_output=True, text=True,
                        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": "/bin/false"})
    assert cp.returncode == 1, (cp.stdout, cp.stderr)
    assert cp.stderr.startswith(f"error: only 2 GB free on the disk holding {root}; torch==2.15.0 with its nvidia "
                                "dependencies needs about 7 GB\n  next: free disk space"), cp.stderr
    assert not (root / ".venv-stock").exists() and "Traceback" not in cp.stderr
