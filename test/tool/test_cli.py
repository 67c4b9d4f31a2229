"""The command line: exit codes, no traceback for OverlayError, --help."""

from __future__ import annotations

import pytest

from conftest import run_cli, tree_digest


@pytest.mark.parametrize("cmd", ["status", "apply", "revert", "wheel", "refresh", "releases"])
def test_help(cmd):
    cp = run_cli(cmd, "--help")
    assert cp.returncode == 0
    assert cp.stdout.startswith(f"usage: torch-fork-overlay {cmd}")


def test_overlay_error_exit_2_without_traceback(fake_install, patches_dir):
    before = tree_digest(fake_install)
    cp = run_cli("revert", "--site-packages", str(fake_install), "--patches-dir", str(patches_dir))
    assert cp.returncode == 2
    assert cp.stdout == ""
    assert cp.stderr.startswith("error: nothing to revert: torch 2.15.0+cu132 at")
    assert "Traceback" not in cp.stderr
    assert tree_digest(fake_install) == before


def test_status_apply_status_revert(fake_install, patches_dir):
    args = ["--site-packages", str(fake_install), "--patches-dir", str(patches_dir)]
    cp = run_cli("status", *args)
    assert cp.returncode == 0, cp.stderr
    assert "torch:         2.15.0+cu132\n" in cp.stdout
    assert "git_version:   d0f2af8b66b20da4baa50644c0cd3f887a2eae2e\n" in cp.stdout
    assert cp.stdout.endswith("files:\n  pristine  torch/_dynamo/config.py\n  pristine  torch/_guards.py\n")
    assert run_cli("apply", *args).returncode == 0
    cp = run_cli("status", *args)
    assert cp.stdout.endswith("files:\n  patched   torch/_dynamo/config.py\n  patched   torch/_guards.py\n")
    assert run_cli("revert", *args).returncode == 0


def test_status_of_unsupported_release(fake_install, patches_dir):
    vpy = fake_install / "torch/version.py"
    vpy.write_text(vpy.read_text().replace("2.15.0+cu132", "2.13.0+cpu"))
    cp = run_cli("status", "--site-packages", str(fake_install), "--patches-dir", str(patches_dir))
    assert cp.returncode == 0
    # the touched files are 2.15.0's bytes: its series serves this install
    assert "served by:     series v2.15.0: touched files identical (no folder v2.13.0)\n" in cp.stdout
    guards = fake_install / "torch/_guards.py"
    guards.write_text(guards.read_text() + "# as 2.13.0 has it\n")
    cp = run_cli("status", "--site-packages", str(fake_install), "--patches-dir", str(patches_dir))
    assert cp.returncode == 0
    assert "series:        none for 2.13.0+cpu (supported: 2.15.0)\n" in cp.stdout
    assert "served by" not in cp.stdout


def test_locate_by_python_without_importing_torch(stock_site_packages):
    from conftest import _stock_python
    from torch_fork_overlay.locate import locate

    inst = locate(python=_stock_python())
    assert (inst.version, inst.base_version) == ("2.15.0+cu132", "2.15.0")
    assert inst.torch_dir == (stock_site_packages / "torch").resolve()
    assert inst.record.name == "RECORD" and inst.record.parent.name.startswith("torch-2.15.0")


def test_python_without_torch(tmp_path):
    import venv

    from torch_fork_overlay.errors import OverlayError
    from torch_fork_overlay.locate import locate

    venv.EnvBuilder(with_pip=False).create(tmp_path / "env")
    py = str(tmp_path / "env/bin/python")
    with pytest.raises(OverlayError) as e:
        locate(python=py)
    assert str(e.value) == (
        f"error: torch is not installed for {py}\n"
        "  likely cause: this interpreter's environment has no torch\n"
        f"  next: {py} -m pip install -r requirements.txt, or pass --python for another env"
    )
