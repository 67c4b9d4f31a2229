"""Command line: argparse only; every subcommand calls one function with
keyword arguments.  To add a subcommand, write ``_add_<name>(sub)`` that
registers its parser with ``set_defaults(func=...)`` and list it in
``SUBCOMMANDS``.

Exit status: 0 ok, 2 on ``OverlayError`` (message printed, no traceback),
128 + N when interrupted by signal N (Ctrl-C: 130; SIGTERM: 143; see
``proc.raise_on_termination``); any other exception is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Callable

from .errors import OverlayError
from .proc import Terminated, raise_on_termination


def _target(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--python", metavar="PATH",
                   help="interpreter whose torch to use (default: the one running this tool)")
    g.add_argument("--site-packages", metavar="DIR", help="site-packages directory holding torch/")


def _patches(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patches-dir", metavar="DIR",
                   help="folder of v<release>/ series (default: $TORCH_FORK_OVERLAY_PATCHES, "
                   "else the repository's patches/)")


def _install_command(sub, name: str, help: str, description: str, module: str, function: str) -> None:
    """status / apply / revert: one installed torch (--python or --site-packages), one series."""
    p = sub.add_parser(name, help=help, description=description)
    _target(p)
    _patches(p)

    def run(a):
        import importlib

        fn = getattr(importlib.import_module(f".{module}", __package__), function)
        print(fn(python=a.python, site_packages=a.site_packages, patches_dir=a.patches_dir))

    p.set_defaults(func=run)


def _add_status(sub) -> None:
    _install_command(sub, "status", "show the installed torch and its patch state",
                     "Show torch version, git_version, path, the series that serves it (its own "
                     "folder, or one whose touched files are byte-identical: 'served by series "
                     "v2.9.1: touched files identical'), "
                     "an apply / revert in progress or interrupted (and how to finish it) "
                     "and, per touched file, pristine / patched / unknown.",
                     "status", "status_report")


def _add_apply(sub) -> None:
    _install_command(sub, "apply", "patch the installed torch (atomic, idempotent)",
                     "Apply the series serving the installed torch (its own folder, or the one whose "
                     "manifest finds its touched files byte-identical); patches under "
                     "test/ are skipped. Checks everything first; on failure nothing changes. "
                     "An interrupted apply or revert is rolled back first. One run per install "
                     "at a time ($TORCH_FORK_OVERLAY_LOCK_TIMEOUT: seconds to wait, default 60).",
                     "apply", "apply_to_install")


def _add_revert(sub) -> None:
    _install_command(sub, "revert", "restore the byte-identical original torch files",
                     "Undo `apply`: restore originals (hash-checked), remove the "
                     "state file and backups, restore RECORD. Also rolls back an interrupted "
                     "apply or revert to pristine.",
                     "apply", "revert_install")


def _add_wheel(sub) -> None:
    p = sub.add_parser("wheel", help="build a patched wheel from the official one",
                       description="Repack the official torch wheel with the series applied and a "
                       "local version label appended (2.15.0+cu132 -> 2.15.0+cu132.fakemode.1, "
                       "2.13.0+cpu -> 2.13.0+cpu.fakemode.1). The series is the one whose manifest "
                       "finds the wheel's touched files byte-identical, so --version X without a "
                       "folder vX downloads X first to compare them.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--version", help="release to fetch with pip download, e.g. 2.15.0 (whatever "
                   "build pip picks: torch==2.13.0 may be 2.13.0+cpu)")
    g.add_argument("--wheel", metavar="PATH", help="the official wheel file")
    p.add_argument("--out-dir", default="dist", help="where to write the wheel (default: dist)")
    p.add_argument("--label", default="fakemode.1", help="local version label to append")
    p.add_argument("--cache-dir", help="download cache (default: $TORCH_FORK_OVERLAY_CACHE or .cache)")
    _patches(p)

    def run(a):
        from .wheel import build_wheel
        build_wheel(version=a.version, wheel_path=a.wheel, out_dir=a.out_dir, label=a.label,
                    patches_dir=a.patches_dir, cache_dir=a.cache_dir)

    p.set_defaults(func=run)


def _add_refresh(sub) -> None:
    p = sub.add_parser(
        "refresh", help="regenerate patches and manifest from edited trees",
        description="Three modes. New patch: --tree DIR --files F.. --message FILE [--name N] "
        "[--replace OLD]. Regenerate: --tree DIR --patch NAME. Manifest only: --manifest-only. "
        "Diffs are taken against pristine (--pristine DIR or --pristine-wheel WHL) plus the "
        "earlier patches of the series.",
    )
    p.add_argument("--version", required=True, help="release of the series, e.g. 2.15.0")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pristine", metavar="DIR", help="stock torch tree (e.g. a stock venv's site-packages)")
    g.add_argument("--pristine-wheel", metavar="WHL", help="the official wheel")
    p.add_argument("--tree", metavar="DIR", help="tree holding the edited files (repo-root layout)")
    m = p.add_mutually_exclusive_group(required=True)
    m.add_argument("--files", nargs="+", metavar="PATH", help="new patch: files it changes, e.g. torch/_guards.py")
    m.add_argument("--patch", metavar="NAME", help="regenerate this patch, keeping its message")
    m.add_argument("--manifest-only", action="store_true", help="only rewrite manifest.json")
    p.add_argument("--message", metavar="FILE", help="new patch: commit message file (upstream PR text)")
    p.add_argument("--name", help="new patch: file name (default NNNN-<subject>.patch)")
    p.add_argument("--replace", metavar="OLD", help="new patch: take OLD's place in the series and delete it")
    _patches(p)

    def run(a):
        from . import refresh as r
        pristine = r.Pristine(tree=a.pristine, wheel=a.pristine_wheel)
        if a.manifest_only:
            print(r.write_series_manifest(version=a.version, pristine=pristine, patches_dir=a.patches_dir))
            return
        if not a.tree:
            p.error("--tree is required with --files or --patch")
        if a.patch:
            r.regenerate_patch(version=a.version, pristine=pristine, tree=a.tree, patch=a.patch,
                               patches_dir=a.patches_dir)
        else:
            if not a.message:
                p.error("--message is required with --files")
            r.new_patch(version=a.version, pristine=pristine, tree=a.tree, files=a.files,
                        message_file=a.message, name=a.name, replace=a.replace,
                        patches_dir=a.patches_dir)

    p.set_defaults(func=run)


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="commit the series onto a PyTorch checkout as upstream PR commits",
                       description="Check the checkout (git repository root, clean tree, HEAD at the claimed "
                       "base, touched files pristine), create a branch and git am the series (code and "
                       "tests) with PR-style messages, project-only trailers stripped. Prints the next "
                       "commands (ghstack or git push) and runs none of them.")
    p.add_argument("--pytorch-src", required=True, metavar="DIR", help="PyTorch git checkout (repository root)")
    p.add_argument("--base", help="v<release> or main (default: v<the newest supported release>); a release "
                   "without a folder of its own is served by the series whose manifest finds the checkout's "
                   "touched files byte-identical")
    p.add_argument("--branch", help="branch to create (default: torch-fork-overlay/fakemode-<base>)")
    p.add_argument("--keep-author", action="store_true",
                   help="keep the patch files' authors (default: you, as git's author identity says)")
    _patches(p)

    def run(a):
        from .export import export
        export(pytorch_src=a.pytorch_src, base=a.base, branch=a.branch, keep_author=a.keep_author,
               patches_dir=a.patches_dir)

    p.set_defaults(func=run)


def _add_upstream_tests(sub) -> None:
    p = sub.add_parser("upstream-tests", help="run PyTorch's own test suites on stock vs patched torch",
                       description="Run named suites of upstream test files from a PyTorch checkout with the "
                       "stock and the patched interpreter; report regressions (pass stock, fail patched), "
                       "suspected regressions (failing on both, differently), fixes, tests failing alike on "
                       "both, files that did not really run, and per side and file passed / failed / errored "
                       "/ skipped / crashed counts. Exit status 1 on a regression, a suspected regression, an "
                       "incomplete run or a file that did not really run (unless its suite expects it). "
                       "Suite fields and how to read the report: docs/upstream.md.")
    p.add_argument("--pytorch-src", metavar="DIR", help="PyTorch checkout providing test/ (required unless --list)")
    p.add_argument("--suite", action="append", metavar="NAME", help="suite to run (repeatable; default: all)")
    p.add_argument("--stock-python", metavar="PATH",
                   help="stock interpreter (default: $TORCH_FORK_OVERLAY_STOCK_PYTHON, else .venv-stock/bin/python)")
    p.add_argument("--patched-python", metavar="PATH",
                   help="patched interpreter (default: $TORCH_FORK_OVERLAY_PATCHED_PYTHON, else .venv/bin/python)")
    p.add_argument("--out-dir", metavar="DIR",
                   help="logs, outcome streams, junit files, report.json (default: build/upstream-tests)")
    p.add_argument("--suites-file", metavar="FILE",
                   help="your own suites TOML (default: the shipped suites.toml; fields: docs/upstream.md, "
                   "\"Custom suites\")")
    p.add_argument("--list", action="store_true", help="list the suites and exit")

    def run(a):
        from . import upstream_tests as ut
        if a.list:
            for s in ut.load_suites(a.suites_file).values():
                files = "".join(f"\n  {f}" for f in s.files)
                print(f"{s.name}: {s.description}{files}" + (f"\n  -k {s.k!r}" if s.k else "")
                      + f"\n  timeout {s.timeout}s"
                      + "".join(f"\n  deselect {n}: {why}" for n, why in s.deselect)
                      + "".join(f"\n  expected not to run {f}: {why}" for f, why in s.expect_not_running))
            return
        if not a.pytorch_src:
            p.error("--pytorch-src is required")
        reports = ut.upstream_tests(pytorch_src=a.pytorch_src, suites=a.suite, stock_python=a.stock_python,
                                    patched_python=a.patched_python, out_dir=a.out_dir,
                                    suites_file=a.suites_file)
        raise SystemExit(ut.exit_status(reports))

    p.set_defaults(func=run)


def _add_source_build(sub) -> None:
    p = sub.add_parser("source-build", help="apply the series to a PyTorch checkout and build a wheel",
                       description="Check the checkout matches a supported series, apply it (tests "
                       "included; idempotent) and run PyTorch's build (pip wheel . --no-build-isolation) "
                       "with PYTORCH_BUILD_VERSION=<release>+<label>. Called by CMakeLists.txt.")
    p.add_argument("--pytorch-src", metavar="DIR", help="PyTorch checkout (repository root; required "
                   "unless --check-cuda)")
    p.add_argument("--use-cuda", default="OFF", type=str.upper, choices=["ON", "OFF", "1", "0", "TRUE", "FALSE"],
                   help="build the CUDA backend (default: OFF)")
    p.add_argument("--cuda-home", metavar="DIR", help="CUDA toolkit root (default: $CUDA_HOME, PATH, /usr/local/cuda)")
    p.add_argument("--max-jobs", type=int, metavar="N", help="parallel compile jobs (MAX_JOBS)")
    p.add_argument("--label", default="fakemode.1", help="local version label (default: fakemode.1)")
    p.add_argument("--build-number", default="1", help="PYTORCH_BUILD_NUMBER (default: 1)")
    p.add_argument("--python", metavar="PATH", help="interpreter that runs PyTorch's build (default: this one)")
    p.add_argument("--dist-dir", default="dist", metavar="DIR", help="where the wheel goes (default: dist)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--dry-run", action="store_true",
                   help="check and apply, then print the build command and environment instead of building "
                   "(also $TORCH_FORK_OVERLAY_DRY_RUN=1)")
    g.add_argument("--check-only", action="store_true", help="only check the checkout and toolkit; change nothing")
    g.add_argument("--check-cuda", action="store_true", help="only find and check the CUDA toolkit")
    _patches(p)

    def run(a):
        from .source_build import check_cuda, source_build
        if a.check_cuda:
            check_cuda(cuda_home=a.cuda_home)
            return
        if not a.pytorch_src:
            p.error("--pytorch-src is required")
        source_build(pytorch_src=a.pytorch_src, use_cuda=a.use_cuda in ("ON", "1", "TRUE"),
                     max_jobs=a.max_jobs, label=a.label, build_number=a.build_number, python=a.python,
                     cuda_home=a.cuda_home, dist_dir=a.dist_dir, dry_run=a.dry_run or None,
                     check_only=a.check_only, patches_dir=a.patches_dir)

    p.set_defaults(func=run)


def _add_releases(sub) -> None:
    p = sub.add_parser("releases", help="list the supported releases and their last test results",
                       description="One row per series folder (patches/v<release>/): release, series, "
                       "what it touches, the tests the last tools/test-releases run ran on it and their "
                       "result (from build/releases/summary.json). --markdown prints the README's "
                       "'Supported releases' table.")
    p.add_argument("--markdown", action="store_true", help="a markdown table (for the README)")
    p.add_argument("--summary", metavar="FILE",
                   help="summary of a tools/test-releases run (default: build/releases/summary.json)")
    p.add_argument("--default", metavar="RELEASE",
                   help="the release tools/test covers (default: torch== in requirements.txt, if found)")
    _patches(p)

    def run(a):
        from . import releases as r
        default = a.default or r.default_release()
        rows = r.releases_table(patches_dir=a.patches_dir, summary=a.summary, default=default)
        print(r.format_table(rows, markdown=a.markdown))

    p.set_defaults(func=run)


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="regenerate every release's series from the one source in fix/",
                       description="Builds each release's stack of patches (fix/stack.toml) from its "
                       "pristine files (the official wheel in --cache-dir/wheels, downloaded with pip "
                       "when missing), checks it applies and matches its manifest, writes "
                       "patches/v<release>/ and prints what each release's series adds and how it "
                       "differs from the newest one. --check changes nothing and exits 1 when a "
                       "series is out of date.")
    p.add_argument("versions", nargs="*", metavar="RELEASE", help="releases (default: all of fix/stack.toml)")
    p.add_argument("--check", action="store_true", help="only say which series differ from the source")
    p.add_argument("--cache-dir", metavar="DIR", help="where wheels are cached (default: ./.cache)")
    _patches(p)

    def run(a):
        from . import generate as g
        from .wheel import default_cache_dir
        stale = g.generate(versions=a.versions, cache_dir=Path(a.cache_dir) if a.cache_dir else default_cache_dir(),
                           patches_dir=a.patches_dir, check=a.check)
        if stale:
            raise OverlayError(f"the series of {', '.join(stale)} differ from what fix/ generates",
                               cause="fix/ changed and the series were not regenerated, or a series was "
                               "edited by hand",
                               next="python -m torch_fork_overlay generate " + " ".join(stale))

    p.set_defaults(func=run)


SUBCOMMANDS: list[Callable] = [_add_status, _add_apply, _add_revert, _add_wheel, _add_refresh]
SUBCOMMANDS += [_add_generate, _add_export, _add_upstream_tests, _add_source_build, _add_releases]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torch-fork-overlay",
        description="Apply this project's patch series to torch: patch an install, "
        "or build a patched wheel.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    raise_on_termination()
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show up as they happen
    try:
        args.func(args)
    except OverlayError as e:
        print(e, file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
        print(f"error: interrupted by {signal.Signals(signum).name}\n"
              "  next: for apply / revert, `python -m torch_fork_overlay status` says whether the "
              "install was left mid-change (the next apply or revert then finishes it)",
              file=sys.stderr)
        return 128 + signum
    return 0
