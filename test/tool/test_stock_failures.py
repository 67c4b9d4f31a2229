"""test/stock_failures.toml (what stock torch does, per range of releases) and
the logic of test/test_stock_shows_the_bug.py that reads it, without torch."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from conftest import REPO
from torch_fork_overlay.series import supported_versions

sys.path.insert(0, str(REPO / "test"))
import test_stock_shows_the_bug as sb  # noqa: E402

# The releases of issues 11 and 12, whether or not their folder exists yet.
ISSUE_RELEASES = ["2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.13.0+cpu", "2.14.1", "2.15.0"]
MISMATCH = ("BackendCompilerFailed: backend='{b}' raised:\nAssertionError: fake mode "
            "(<torch._subclasses.fake_tensor.FakeTensorMode object at 0x7f00>) from tracing context 0 "
            "doesn't match mode (<torch._subclasses.fake_tensor.FakeTensorMode object at 0x7e00>) from "
            "fake tensor input 0\n\nfake mode from tracing context 0 allocated at:\n  File ...")
DATA_PTR = ("InductorError: RuntimeError: Cannot access data pointer of Tensor (e.g. FakeTensor, "
            "FunctionalTensor). If you're using torch.compile/export/fx, ...")


def test_entries_are_well_formed():
    data = sb.load_data()
    assert data["seed"], "at least one [[seed]] range"
    for e in data["seed"]:
        SpecifierSet(e["releases"])  # raises on a bad specifier
        assert " ".join(e["why"].split()), e
        fails, passes = set(e.get("fails", {})), set(e.get("passes", []))
        assert not fails & passes, e["releases"]
        assert fails | passes == set(sb.BACKENDS), f"{e['releases']}: say what every backend does on stock"
        assert fails, f"{e['releases']}: the seed case must fail on stock somewhere"
    for e in data.get("contract", []):
        SpecifierSet(e["releases"])
        assert e["fails"] and not set(e["fails"]) & set(e.get("passes", []))


@pytest.mark.parametrize("release", sorted(set(ISSUE_RELEASES) | set(supported_versions(REPO / "patches"))))
def test_every_release_falls_in_exactly_one_seed_range(release):
    found = sb.entries_for(release, "seed")
    assert len(found) == 1, f"{release}: {[e['releases'] for e in found]}"


@pytest.mark.parametrize("release, backend, message", [
    ("2.8.0", "aot_eager", MISMATCH), ("2.9.1", "inductor", MISMATCH), ("2.10.0", "aot_eager", MISMATCH),
    ("2.11.0", "inductor", DATA_PTR), ("2.13.0+cpu", "inductor", DATA_PTR), ("2.15.0+cu132", "inductor", DATA_PTR),
])
def test_each_range_expects_its_release_reason(release, backend, message):
    """<= 2.10: detect_fake_mode's assertion on aot_eager and inductor; >= 2.11:
    inductor reads data pointers (aot_eager works)."""
    expected = sb.seed_expectation(release)
    results = {b: "ok" for b in sb.BACKENDS}
    for b in expected["fails"]:
        results[b] = message.format(b=b)
    assert backend in expected["fails"]
    assert sb.stock_problems(expected, results) == []
    other = MISMATCH if message is DATA_PTR else DATA_PTR
    results[backend] = other.format(b=backend)
    assert [p.split(" ")[:4] for p in sb.stock_problems(expected, results)] == [
        [backend, "failed", "on", "stock,"]]


def test_stock_problems_name_what_is_wrong():
    expected = sb.seed_expectation("2.13.0")
    assert sb.stock_problems(expected, {"eager": "ok", "aot_eager": "ok", "inductor": "ok"}) == [
        "inductor passed on stock: the seed case does not show the bug here (expected 'Cannot access "
        "data pointer'; >=2.11: " + " ".join(expected["why"].split()) + ")"]
    problems = sb.stock_problems(expected, {"eager": "ImportError: no numpy", "inductor": DATA_PTR})
    assert problems == ["eager should pass on stock (sanity check), but: ImportError: no numpy",
                        "aot_eager should pass on stock (sanity check), but: did not run"]


def test_release_outside_every_range_fails_loudly():
    data = {"seed": [{"releases": "<2.11"}, {"releases": ">=2.11,<2.16"}]}
    with pytest.raises(pytest.fail.Exception, match=r"torch 2.16.0 falls in 0 \[\[seed\]\] ranges \(none\)"):
        sb.seed_expectation("2.16.0", data)
    assert sb.release_of("2.15.0+cu132.fakemode.1") == "2.15.0" and sb.release_of("2.16.0a0") == "2.16.0"


def _fake_python(tmp_path: Path, body: str) -> str:
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\n" + body)
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    return str(py)


def test_run_seed_reads_the_results(tmp_path):
    py = _fake_python(tmp_path, "echo VERSION 2.13.0+cpu\necho CASE eager\n"
                      "echo 'RESULT [\"eager\", \"ok\"]'\necho CASE inductor\n"
                      "echo 'RESULT [\"inductor\", \"InductorError: Cannot access data pointer\"]'\n")
    assert sb.run_seed(py) == ("2.13.0+cpu", {"eager": "ok", "inductor": "InductorError: Cannot access data pointer"})


def test_run_seed_names_the_case_that_crashed(tmp_path):
    py = _fake_python(tmp_path, "echo VERSION 2.15.0\necho CASE inductor\nkill -SEGV $$\n")
    with pytest.raises(pytest.fail.Exception, match="stopped \\(killed by SIGSEGV\\) during backend inductor"):
        sb.run_seed(py)


def test_sides_skip_without_their_interpreter(monkeypatch):
    monkeypatch.delenv("TORCH_FORK_OVERLAY_PATCHED_PYTHON", raising=False)
    with pytest.raises(pytest.skip.Exception, match="TORCH_FORK_OVERLAY_PATCHED_PYTHON is not set"):
        sb.interpreter("patched")
