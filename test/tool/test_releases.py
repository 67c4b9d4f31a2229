"""Many releases: which series serves a torch is decided by the hashes of the
files it touches (``releases``), on synthetic installs and wheels of several
"releases" (each flavour of the synthetic files is another release's bytes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from conftest import REPO, make_synthetic_install, make_synthetic_series, run_cli, synthetic_files, tree_digest
from torch_fork_overlay import releases as rl
from torch_fork_overlay import refresh
from torch_fork_overlay import state as st
from torch_fork_overlay import wheel as wh
from torch_fork_overlay.apply import apply_to_install, revert_install
from torch_fork_overlay.errors import OverlayError
from torch_fork_overlay.series import load_series, supported_versions
from torch_fork_overlay.status import status_report

F29, F213, F213CPU, F216 = "# torch 2.9\n", "# torch 2.13\n", "# torch 2.13 cpu\n", "# torch 2.16\n"
TAGS = "cp311-cp311-manylinux_2_28_x86_64"


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """patches/ with v2.9.1, v2.13.0, v2.13.0+cpu (another build's bytes) and v2.15.0."""
    base = tmp_path_factory.mktemp("many")
    pdir = base / "patches"
    for i, (release, flavour) in enumerate([("2.9.1", F29), ("2.13.0", F213), ("2.13.0+cpu", F213CPU),
                                            ("2.15.0", "")]):
        make_synthetic_series(base / str(i), pdir, release=release, flavour=flavour)
    return pdir


def _install(tmp_path, version, flavour="", **kw) -> Path:
    return make_synthetic_install(tmp_path / "install", version=version, flavour=flavour, **kw)


def _quiet(fn, **kw):
    return fn(out=lambda s: None, **kw)


def _served(sp: Path, pdir: Path) -> str:
    return next(l for l in status_report(site_packages=sp, patches_dir=pdir).splitlines()
                if l.startswith("served by:"))


# -- hash-based serving -------------------------------------------------------

def test_sibling_release_is_served_by_the_series_with_its_bytes(tmp_path, many):
    """2.9.0 has no folder; its touched files are 2.9.1's bytes: v2.9.1 serves it,
    for status, apply and revert, and the state file says so."""
    sp = _install(tmp_path, "2.9.0+cu128", F29)
    before = tree_digest(sp)
    assert _served(sp, many) == "served by:     series v2.9.1: touched files identical (no folder v2.9.0)"
    lines = []
    msg = apply_to_install(site_packages=sp, patches_dir=many, out=lines.append)
    assert msg.startswith(f"applied 2 patch(es) of the v2.9.1 series to torch 2.9.0+cu128 at {sp / 'torch'}")
    assert "(served by series v2.9.1: touched files identical (no folder v2.9.0))" in lines[-1]
    assert json.loads((sp / "torch" / st.STATE_NAME).read_text())["series"] == "2.9.1"
    report = status_report(site_packages=sp, patches_dir=many)
    assert "served by:     series v2.9.1: touched files identical (no folder v2.9.0)\n" in report
    assert report.endswith("files:\n  patched   torch/_dynamo/config.py\n  patched   torch/_guards.py")
    assert _quiet(apply_to_install, site_packages=sp, patches_dir=many).startswith("already applied")
    _quiet(revert_install, site_packages=sp, patches_dir=many)
    assert tree_digest(sp) == before


@pytest.mark.parametrize("version, flavour, served", [
    # the version string says 2.9.0, the bytes are 2.15.0's: v2.15.0 serves it
    ("2.9.0", "", "series v2.15.0: touched files identical (no folder v2.9.0)"),
    # a 2.15.0 whose touched files are 2.9.1's bytes is served by v2.9.1, not by its own folder
    ("2.15.0+cu132", F29, "series v2.9.1: touched files identical (they differ from those v2.15.0 was made for)"),
    ("2.15.0+cu132", "", "series v2.15.0 (this release's own)"),
    ("2.15.2", "", "series v2.15.0: touched files identical (no folder v2.15.2)"),
])
def test_hashes_decide_not_the_version(tmp_path, many, version, flavour, served):
    assert _served(_install(tmp_path, version, flavour), many) == f"served by:     {served}"


def test_unsupported_release_is_refused_with_the_supported_ones(tmp_path, many):
    sp = _install(tmp_path, "2.16.0+cu130", F216)
    before = tree_digest(sp)
    cp = run_cli("apply", "--site-packages", str(sp), "--patches-dir", str(many))
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert cp.stderr == (
        f"error: no patch series for torch 2.16.0+cu130 at {sp / 'torch'} in {many}: no folder v2.16.0/, "
        "and no series' manifest matches its files (the sha256 of each file the series touches)\n"
        "  likely cause: torch 2.16.0+cu130 is not a supported release: this project supports torch "
        "2.9.1, 2.13.0, 2.13.0+cpu, 2.15.0; another release is served only by a series whose touched "
        "files it has byte for byte\n"
        "  next: pip install torch==2.15.0, then rerun; or build a patched wheel of a supported release: "
        "python -m torch_fork_overlay wheel --version 2.15.0\n"
    )
    cp = run_cli("status", "--site-packages", str(sp), "--patches-dir", str(many))
    assert cp.returncode == 0
    assert "series:        none for 2.16.0+cu130 (supported: 2.9.1, 2.13.0, 2.13.0+cpu, 2.15.0)\n" in cp.stdout
    assert "files:" not in cp.stdout
    assert tree_digest(sp) == before


def test_own_release_with_other_bytes_names_the_files(tmp_path, many):
    """2.15.0 whose files match no series: its own folder is still used, to say which files differ."""
    sp = _install(tmp_path, "2.15.0+cu132", F216)
    report = status_report(site_packages=sp, patches_dir=many)
    assert ("served by:     nothing: the files the v2.15.0 series (this release's own) touches match "
            "neither its pristine nor its patched sha256\n") in report
    assert report.endswith("files:\n  unknown   torch/_dynamo/config.py\n  unknown   torch/_guards.py")
    with pytest.raises(OverlayError, match="cannot apply the v2.15.0 series to torch 2.15.0"):
        _quiet(apply_to_install, site_packages=sp, patches_dir=many)


def test_applied_series_is_tried_first(tmp_path, many):
    """An install patched by v2.9.1 whose files someone then edited: status compares
    them with v2.9.1 (its state file), not with the folder of its version."""
    sp = _install(tmp_path, "2.15.0+cu132", F29)
    _quiet(apply_to_install, site_packages=sp, patches_dir=many)
    (sp / "torch/_guards.py").write_text((sp / "torch/_guards.py").read_text() + "# edit\n")
    report = status_report(site_packages=sp, patches_dir=many)
    assert ("served by:     nothing: the files the v2.9.1 series (the one its state file names) "
            "touches match") in report
    assert "  unknown   torch/_guards.py" in report and "  patched   torch/_dynamo/config.py" in report


# -- local version labels (+cpu) ------------------------------------------------

@pytest.mark.parametrize("flavour, served", [
    (F213CPU, "series v2.13.0+cpu (this release's own)"),
    # a CPU build whose touched files are the CUDA build's bytes needs no folder of its own
    (F213, "series v2.13.0: touched files identical (they differ from those v2.13.0+cpu was made for)"),
])
def test_cpu_label(tmp_path, many, flavour, served):
    sp = _install(tmp_path, "2.13.0+cpu", flavour, local_in_metadata=True)
    assert (sp / "torch-2.13.0+cpu.dist-info").is_dir()
    before = tree_digest(sp)
    report = status_report(site_packages=sp, patches_dir=many)
    assert "torch:         2.13.0+cpu\n" in report and f"served by:     {served}\n" in report
    series = served.split()[1][1:].rstrip(":")
    assert _quiet(apply_to_install, site_packages=sp, patches_dir=many).startswith(
        f"applied 2 patch(es) of the v{series} series to torch 2.13.0+cpu at")
    _quiet(revert_install, site_packages=sp, patches_dir=many)
    assert tree_digest(sp) == before


def test_cpu_install_served_by_the_plain_release_folder(tmp_path, many):
    """Without a v2.13.0+cpu folder, 2.13.0+cpu is served by v2.13.0 as its own."""
    pdir = tmp_path / "patches"
    shutil.copytree(many, pdir)
    shutil.rmtree(pdir / "v2.13.0+cpu")
    sp = _install(tmp_path, "2.13.0+cpu", F213, local_in_metadata=True)
    assert _served(sp, pdir) == "served by:     series v2.13.0 (this release's own)"


def _synthetic_wheel(dest: Path, version: str, flavour: str, *, metadata_version: str | None = None) -> Path:
    """A small valid wheel of the synthetic files (RECORD written by WheelFile)."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"torch-{version}-{TAGS}.whl"
    files = synthetic_files(version, flavour)
    meta = metadata_version or version
    with WheelFile(str(path), "w") as wf:
        for rel, data in files.items():
            wf.writestr(rel, data)
        wf.writestr(f"torch-{meta}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: torch\nVersion: {meta}\n")
        wf.writestr(f"torch-{meta}.dist-info/WHEEL",
                    f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {TAGS}\n")
    return path


def test_cpu_wheel_keeps_its_label(tmp_path, many):
    whl = _synthetic_wheel(tmp_path / "in", "2.13.0+cpu", F213CPU)
    built = wh.build_wheel(wheel_path=whl, out_dir=tmp_path / "dist", patches_dir=many)
    assert built.name == f"torch-2.13.0+cpu.fakemode.1-{TAGS}.whl"
    with WheelFile(str(built)) as wf:
        assert b"__version__ = '2.13.0+cpu.fakemode.1'" in wf.read("torch/version.py")
        assert b"\nVersion: 2.13.0+cpu.fakemode.1\n" in wf.read("torch-2.13.0+cpu.fakemode.1.dist-info/METADATA")
        manifest = load_series("2.13.0+cpu", patches_dir=many).manifest
        assert all(st.sha256_bytes(wf.read(r)) == v["patched"] for r, v in manifest.items())


# -- wheel --version X without a folder vX: downloaded first, then matched ---------

@pytest.fixture
def fake_download(monkeypatch, tmp_path):
    """download_wheel returns a synthetic wheel of the asked release; ``flavours``
    says whose bytes it carries."""
    flavours: dict[str, str] = {}
    calls = []

    def download(*, version, cache_dir):
        calls.append(version)
        return _synthetic_wheel(tmp_path / "downloads", version, flavours[version])

    monkeypatch.setattr(wh, "download_wheel", download)
    return flavours, calls


def test_wheel_version_without_folder_downloads_then_matches(tmp_path, many, fake_download, capsys):
    flavours, calls = fake_download
    flavours["2.9.0"] = F29
    built = wh.build_wheel(version="2.9.0", out_dir=tmp_path / "dist", patches_dir=many)
    assert calls == ["2.9.0"] and built.name == f"torch-2.9.0+fakemode.1-{TAGS}.whl"
    out = capsys.readouterr().out
    assert (f"no folder v2.9.0 in {many}: downloading torch 2.9.0 first, to compare the files each "
            "supported series touches with their sha256 (supported: 2.9.1, 2.13.0, 2.13.0+cpu, 2.15.0)") in out
    assert "torch 2.9.0: served by series v2.9.1: touched files identical (no folder v2.9.0)" in out


def test_wheel_version_without_folder_refused_after_download(tmp_path, many, fake_download):
    flavours, calls = fake_download
    flavours["2.16.0"] = F216
    (tmp_path / "dist").mkdir()
    with pytest.raises(OverlayError) as e:
        wh.build_wheel(version="2.16.0", out_dir=tmp_path / "dist", patches_dir=many)
    whl = tmp_path / "downloads" / f"torch-2.16.0-{TAGS}.whl"
    assert e.value.what == (
        f"no patch series for torch 2.16.0 (downloaded first to {whl}: without a folder v2.16.0, only "
        f"its files' sha256 can tell which series serves it) in {many}: no folder v2.16.0/, and no "
        "series' manifest matches its files (the sha256 of each file the series touches)")
    assert list((tmp_path / "dist").iterdir()) == []


def test_wheel_version_refused_before_download_without_any_series(tmp_path, fake_download):
    """No series at all: refused before anything is downloaded."""
    _, calls = fake_download
    (tmp_path / "empty").mkdir()
    with pytest.raises(OverlayError, match="holds no v<release>/ folder"):
        wh.build_wheel(version="2.9.0", out_dir=tmp_path / "dist", patches_dir=tmp_path / "empty")
    assert calls == []


# -- README files and header comments in a series folder --------------------------

def test_readme_and_header_comment_are_ignored(tmp_path, many):
    pdir = tmp_path / "patches"
    shutil.copytree(many, pdir)
    d = pdir / "v2.9.1"
    readme = "# v2.9.1\n\nDiffers from v2.15.0: 2.9 lacks `foo`; 0001 uses `bar` instead.\n"
    (d / "README.md").write_text(readme)
    (d / "README").write_text("plain README too\n")
    series = (d / "series").read_text()
    (d / "series").write_text("# Differs from v2.15.0: see README.md (2.9 lacks foo).\n" + series)
    s = load_series("2.9.1", patches_dir=pdir)
    assert [p.name for p in s.patches] == [p.name for p in load_series("2.9.1", patches_dir=many).patches]
    sp = _install(tmp_path, "2.9.1", F29)
    _quiet(apply_to_install, site_packages=sp, patches_dir=pdir)
    # refresh keeps them, and does not list them
    pristine = refresh.Pristine(tree=make_synthetic_install(tmp_path / "pristine", version="2.9.1", flavour=F29))
    refresh.write_series_manifest(version="2.9.1", pristine=pristine, patches_dir=pdir)
    assert (d / "README.md").read_text() == readme
    assert (d / "series").read_text().startswith("# Differs from v2.15.0")
    assert "README" not in (d / "manifest.json").read_text()
    # a folder holding only a README (e.g. why a release is not supported) is no series
    (pdir / "v2.10.0").mkdir()
    (pdir / "v2.10.0" / "README.md").write_text("2.10.0 is served by v2.9.1\n")
    assert supported_versions(pdir) == ["2.9.1", "2.13.0", "2.13.0+cpu", "2.15.0"]


# -- the order candidates are tried in -------------------------------------------

def test_candidates_order():
    sup = ["2.8.0", "2.9.1", "2.10.0", "2.13.0", "2.13.0+cpu", "2.15.0"]
    assert rl.candidates("2.9.0", sup) == ["2.9.1", "2.15.0", "2.13.0+cpu", "2.13.0", "2.10.0", "2.8.0"]
    assert rl.candidates("2.13.0+cpu", sup)[:2] == ["2.13.0+cpu", "2.13.0"]
    assert rl.candidates("2.13.0+cu130", sup)[:2] == ["2.13.0", "2.13.0+cpu"]
    assert rl.candidates("2.15.0", sup, applied="2.8.0")[:2] == ["2.8.0", "2.15.0"]
    assert rl.candidates("2.15.0", sup, applied="9.9.9")[0] == "2.15.0"  # gone from patches/


def test_series_that_only_creates_files_serves_only_its_own_release():
    manifest = {"torch/new.py": {"pristine": None, "patched": "a" * 64}}
    assert rl.manifest_match(manifest, lambda rel: None) == rl.PRISTINE  # own release: fine
    # ... but find_serving never offers it to another release (nothing to compare)


def test_only_created_files_not_offered_to_others(tmp_path, many):
    pdir = tmp_path / "patches"
    shutil.copytree(many, pdir)
    m = pdir / "v2.13.0" / "manifest.json"
    data = json.loads(m.read_text())
    for v in data["files"].values():
        v["pristine"] = None
    m.write_text(json.dumps(data))
    sp = _install(tmp_path, "2.12.0", F216)
    with pytest.raises(OverlayError, match="no patch series for torch 2.12.0"):
        _quiet(apply_to_install, site_packages=sp, patches_dir=pdir)


def test_unreadable_sibling_manifest_is_named_not_fatal(tmp_path, many):
    pdir = tmp_path / "patches"
    shutil.copytree(many, pdir)
    (pdir / "v2.13.0" / "manifest.json").write_text("{")
    # another release is still served ...
    assert _served(_install(tmp_path / "a", "2.9.0", F29), pdir).startswith("served by:     series v2.9.1")
    # ... and a refusal says what could not be compared
    with pytest.raises(OverlayError) as e:
        _quiet(apply_to_install, site_packages=_install(tmp_path / "b", "2.16.0", F216), patches_dir=pdir)
    assert "(not compared, unreadable: v2.13.0 (" in e.value.cause


# -- the supported releases table --------------------------------------------------

def test_releases_table(tmp_path, many):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"finished": "2026-12-01T10:00:00", "releases": [
        {"release": "2.9.1", "installed": "2.9.1+cu128", "seconds": 263, "ok": True,
         "tests": "contract tests (2 files, -n 2)", "result": "pass: 61 passed, 3 skipped"},
    ]}))
    rows = rl.releases_table(patches_dir=many, summary=summary, default="2.15.0")
    assert [r["release"] for r in rows] == ["2.9.1", "2.13.0", "2.13.0+cpu", "2.15.0"]
    assert rows[0] == {
        "release": "2.9.1", "series": "`patches/v2.9.1/` (3 patch(es))",
        "touches": "2 file(s): `torch/_dynamo/`, `torch/_guards.py`; 1 test patch(es)",
        "tests": "seed case stock + patched; contract tests (2 files, -n 2)",
        "result": "pass: 61 passed, 3 skipped (torch 2.9.1+cu128, 4 min 23 s, 2026-12-01)",
    }
    assert rows[1]["result"] == "not in the last tools/test-releases run"
    assert rows[3]["tests"] == "tools/test: the whole suite (test/)"
    md = rl.format_table(rows, markdown=True).splitlines()
    assert md[0] == "| release | series | what it touches | tests run | result |"
    assert len(md) == 2 + 4
    cp = run_cli("releases", "--markdown", "--patches-dir", str(many), "--summary", str(summary))
    assert cp.returncode == 0 and cp.stdout.splitlines()[2].startswith("| 2.9.1 | `patches/v2.9.1/`")
    summary.write_text("{")
    cp = run_cli("releases", "--patches-dir", str(many), "--summary", str(summary))
    assert cp.returncode == 2 and cp.stderr.startswith(f"error: cannot read {summary}")


# -- the shipped series -------------------------------------------------------------

SHIPPED = REPO / "patches"


def test_shipped_series_are_not_copies(tmp_path):
    """STYLE section 7: a series serves every release with the same bytes, so two
    folders with the same pristine hashes are one series copied to be renamed."""
    pristine = {}
    for v in supported_versions(SHIPPED):
        m = load_series(v, patches_dir=SHIPPED).manifest
        key = json.dumps({r: h["pristine"] for r, h in sorted(m.items())})
        assert key not in pristine, (f"v{v} and v{pristine.get(key)} have the same pristine files: keep one; "
                                     "it serves both releases")
        pristine[key] = v


def test_shipped_older_series_say_how_they_differ():
    """STYLE section 7: each older series says (README or a header comment in
    ``series``) what it differs from the newest one in, naming it."""
    sup = supported_versions(SHIPPED)
    for v in sup[:-1]:
        d = SHIPPED / f"v{v}"
        readmes = [p for p in d.iterdir() if p.name.upper().startswith("README")]
        comments = [l for l in (d / "series").read_text().splitlines() if l.startswith("#")]
        said = " ".join([*(p.read_text() for p in readmes), *comments])
        assert sup[-1] in said, (f"{d}: add a README.md (or a '#' header in series) saying what this "
                                 f"series differs from v{sup[-1]} in, and why")
