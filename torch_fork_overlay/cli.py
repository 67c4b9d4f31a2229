"""Command line: argparse only; every subcommand calls one function with
keyword arguments.  To add a subcommand, write ``_add_<name>(sub)`` that
registers its parser with ``set_defaults(func=...)`` and list it in
``SUBCOMMANDS``.

Exit status: 0 ok, 2 on ``OverlayError`` (message printed, no traceback);
any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from .errors import OverlayError


def _target(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--python", metavar="PATH",
                   help="interpreter whose torch to use (default: the one running this tool)")
    g.add_argument("--site-packages", metavar="DIR", help="site-packages directory holding torch/")


def _patches(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patches-dir", metavar="DIR",
                   help="folder of v<release>/ series (default: $TORCH_FORK_OVERLAY_PATCHES, "
                   "else the repository's patches/)")


def _add_status(sub) -> None:
    p = sub.add_parser("status", help="show the installed torch and its patch state",
                       description="Show torch version, git_version, path, the matching series "
                       "and, per touched file, pristine / patched / unknown.")
    _target(p)
    _patches(p)

    def run(a):
        from .status import status_report
        print(status_report(python=a.python, site_packages=a.site_packages, patches_dir=a.patches_dir))

    p.set_defaults(func=run)


def _add_apply(sub) -> None:
    p = sub.add_parser("apply", help="patch the installed torch (atomic, idempotent)",
                       description="Apply the series matching the installed torch; patches under "
                       "test/ are skipped. Checks everything first; on failure nothing changes.")
    _target(p)
    _patches(p)

    def run(a):
        from .apply import apply_to_install
        print(apply_to_install(python=a.python, site_packages=a.site_packages, patches_dir=a.patches_dir))

    p.set_defaults(func=run)


def _add_revert(sub) -> None:
    p = sub.add_parser("revert", help="restore the byte-identical original torch files",
                       description="Undo `apply`: restore originals (hash-checked), remove the "
                       "state file and backups, restore RECORD.")
    _target(p)
    _patches(p)

    def run(a):
        from .apply import revert_install
        print(revert_install(python=a.python, site_packages=a.site_packages, patches_dir=a.patches_dir))

    p.set_defaults(func=run)


def _add_wheel(sub) -> None:
    p = sub.add_parser("wheel", help="build a patched wheel from the official one",
                       description="Repack the official torch wheel with the series applied and a "
                       "local version label appended (2.15.0+cu132 -> 2.15.0+cu132.fakemode.1).")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--version", help="release to fetch with pip download, e.g. 2.15.0")
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


SUBCOMMANDS: list[Callable] = [_add_status, _add_apply, _add_revert, _add_wheel, _add_refresh]


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
    try:
        args.func(args)
    except OverlayError as e:
        print(e, file=sys.stderr)
        return 2
    return 0
