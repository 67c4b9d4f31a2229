"""``generate``: every release's series from the one source in ``fix/``.

The fix is written once (``fix/``, see its README): new modules under
``fix/src/`` that every series adds byte for byte, a per-release adapter
module chosen from ``fix/compat/`` by release range, small hooks into existing
PyTorch files (``fix/hooks/<patch>/<path>.diff``, written against the newest
release, with ``<path>@<first>-<last>.diff`` overrides where a release's file
differs; an empty override leaves the file alone there), the commit messages,
and the tests (``test/`` of this repository).  ``fix/stack.toml`` orders them
into a stack of patches.

For each release this builds, in a scratch git repository holding the
release's pristine files (from its official wheel in the cache, downloaded
with pip when missing), one commit per patch of the stack, then
``git format-patch`` s them into ``patches/v<release>/`` through refresh's
candidate folder: the new series must apply to pristine files and match its
rewritten manifest before anything in ``patches/`` changes.  A patch whose
diff and message are unchanged keeps its file as it was (no churn from dates).
The series README is generated too: what this release's series differs from
the newest one in, and how many lines each patch adds to existing PyTorch
files.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from packaging.version import Version

from .errors import OverlayError
from .refresh import Pristine, _Candidate, _git, _locked, _root
from .series import SERIES, read_patch_text

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fix"
README = "README.md"
_RANGE = re.compile(r"^(?P<path>.+?)(?:@(?P<first>[0-9][^-@]*)-(?P<last>[0-9][^-@]*))?\.diff$")
_VOLATILE = re.compile(r"^(Date: .*|Last-Update: .*)$", re.M)


def _in_range(version: str, first: str, last: str) -> bool:
    return Version(first) <= Version(version) <= Version(last)


@dataclasses.dataclass
class Hook:
    target: str        # the file it edits, e.g. torch/_dynamo/config.py
    path: Path         # the .diff
    override: str | None  # "2.8.0-2.10.0" or None for the default

    def why(self) -> str:
        """The override's header: the lines before its first ``---``."""
        lines = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.startswith(("--- ", "diff ")):
                break
            lines.append(line)
        return " ".join(l.strip() for l in lines if l.strip())


@dataclasses.dataclass
class StackPatch:
    id: str
    message: Path
    new: list[str]
    tests: list[str]
    compat: str | None
    first: str | None
    last: str | None
    note: str | None = None  # one line for the series README: where it comes from, or why it is kept

    def applies_to(self, version: str) -> bool:
        return (self.first is None or Version(version) >= Version(self.first)) and (
            self.last is None or Version(version) <= Version(self.last))

    def hooks(self, fix: Path, version: str) -> list[Hook]:
        """This patch's hooks for ``version``: per target file, the override
        whose range holds it, else the default."""
        chosen: dict[str, Hook] = {}
        base = fix / "hooks" / self.id
        for p in sorted(base.rglob("*.diff")) if base.is_dir() else []:
            m = _RANGE.match(p.relative_to(base).as_posix())
            if not m:
                continue
            target = m["path"]
            if m["first"]:
                if _in_range(version, m["first"], m["last"]):
                    chosen[target] = Hook(target, p, f"{m['first']}-{m['last']}")
            else:
                chosen.setdefault(target, Hook(target, p, None))
        return [chosen[t] for t in sorted(chosen)]


@dataclasses.dataclass
class Stack:
    fix: Path
    releases: list[str]
    newest: str
    patches: list[StackPatch]


def load_stack(fix: Path = FIX) -> Stack:
    path = fix / "stack.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        patches = [
            StackPatch(id=p["id"], message=fix / p["message"], new=p.get("new", []),
                       tests=p.get("tests", []), compat=p.get("compat"),
                       first=p.get("first"), last=p.get("last"), note=p.get("note"))
            for p in data["patch"]
        ]
        releases = sorted(data["releases"], key=Version)
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as e:
        raise OverlayError(f"cannot read the fix's stack {path} ({type(e).__name__}: {e})",
                           cause="the file is missing or not in the format fix/README.md describes",
                           next=f"see what changed in it (git diff -- {path}) and fix it") from None
    return Stack(fix=fix, releases=releases, newest=releases[-1], patches=patches)


def _compat_source(fix: Path, version: str) -> Path:
    for p in sorted((fix / "compat").glob("*.py")):
        first, _, last = p.stem.partition("-")
        if last and _in_range(version, first, last):
            return p
    raise OverlayError(f"fix/compat/ has no adapter for torch {version}",
                       cause="no fix/compat/<first>-<last>.py range holds this release",
                       next="add the release to the range of the adapter that fits it, or a new one")


def _diff_targets(hook: Hook) -> list[str]:
    text = hook.path.read_text(encoding="utf-8")
    return sorted({m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", text, re.M)})


def _apply_hook(repo: Path, hook: Hook, *, version: str, notes: list[str]) -> None:
    """Apply a hook with ``patch``: at an offset if the file moved, never with
    fuzz (a context that differs may place a hunk in the wrong function: a
    release whose file differs gets an override instead)."""
    if not hook.path.read_text(encoding="utf-8").strip() or not _diff_targets(hook):
        return  # an empty override: this release keeps the file as it is
    cp = subprocess.run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch",
                         "--reject-file=-", "--fuzz=0", "-i", str(hook.path)],
                        cwd=repo, capture_output=True, text=True)
    if cp.returncode != 0:
        rel = hook.path.relative_to(ROOT) if hook.path.is_relative_to(ROOT) else hook.path
        raise OverlayError(
            f"hook {rel} does not apply to torch {version}'s {hook.target}:\n"
            + "\n".join("    " + l for l in (cp.stdout + cp.stderr).strip().splitlines()[-8:]),
            cause=f"torch {version}'s file differs from the one the hook was written against",
            next=f"write an override for it, {Path(rel).with_name(Path(hook.target).name)}@<first>-<last>.diff, "
            f"against torch {version}'s file after the earlier patches (see fix/README.md)",
        )
    for line in cp.stdout.splitlines():
        if "offset" in line:
            notes.append(f"{hook.target}: {line.strip()}")


def _added_lines(repo: Path, new: set[str]) -> dict[str, int]:
    """Lines the HEAD commit adds to files that exist in pristine torch."""
    out = _git(repo, "diff", "--numstat", "HEAD~1", "HEAD").stdout
    added: dict[str, int] = {}
    for line in out.splitlines():
        a, _, path = line.split("\t", 2)
        if path not in new and not path.startswith("test/") and a != "-":
            added[path] = int(a)
    return added


def _pristine_for(version: str, cache_dir: Path) -> Pristine:
    from .wheel import download_wheel

    wheels = sorted([*(cache_dir / "wheels").glob(f"torch-{version}-*.whl"),
                     *(cache_dir / "wheels").glob(f"torch-{version}+*.whl")])
    return Pristine(wheel=wheels[-1] if wheels else download_wheel(version=version, cache_dir=cache_dir))


@dataclasses.dataclass
class Generated:
    version: str
    names: list[str]
    texts: dict[str, str]
    added: dict[str, dict[str, int]]   # per patch name: lines added per existing file
    overrides: dict[str, list[Hook]]   # per patch name
    notes: list[str]
    skipped: list[str]                 # stack patches that do not apply to this release
    readme: str = ""


def build_series(*, stack: Stack, version: str, pristine: Pristine, tests_root: Path = ROOT,
                 work: Path) -> Generated:
    """The stack's commits for ``version`` in a scratch repository, formatted."""
    repo = work / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    patches = [p for p in stack.patches if p.applies_to(version)]
    hooks = {p.id: p.hooks(stack.fix, version) for p in patches}
    new_files = {f for p in patches for f in p.new} | {p.compat for p in patches if p.compat}
    existing = sorted({t for hs in hooks.values() for h in hs for t in _diff_targets(h)} - new_files)
    for rel in existing:
        data = pristine.read(rel)
        if data is None:
            raise OverlayError(f"torch {version} has no {rel}, which a hook of fix/ edits",
                               cause="the file is new in a later release",
                               next=f"give that hook an empty override for {version}")
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", f"pristine torch {version}")
    gen = Generated(version=version, names=[], texts={}, added={}, overrides={}, notes=[],
                    skipped=[p.id for p in stack.patches if not p.applies_to(version)])
    added: list[dict[str, int]] = []
    overridden: list[list[Hook]] = []
    for p in patches:
        for rel in p.new:
            dest = repo / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(stack.fix / "src" / rel, dest)
        if p.compat:
            (repo / p.compat).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_compat_source(stack.fix, version), repo / p.compat)
        for h in hooks[p.id]:
            _apply_hook(repo, h, version=version, notes=gen.notes)
        for rel in p.tests:
            dest = repo / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tests_root / rel, dest)
        msg = p.message.read_text(encoding="utf-8").rstrip("\n") + "\n"
        overrides = [h for h in hooks[p.id] if h.override]
        if version != stack.newest and (overrides or p.first or p.last):
            msg += f"\nDifferences from the {stack.newest} series (torch {version}):\n"
            if p.first or p.last:
                msg += f"- Only in the series of torch {p.first or ''}-{p.last or ''}.\n"
            for h in overrides:
                msg += f"- {h.target}: {h.why() or 'this release keeps the file as it is'}\n"
        msg += f"\nApplies-To: torch {version}\nForwarded: not-yet\n" \
               f"Last-Update: {datetime.date.today().isoformat()}\n"
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-F", "-", input=msg)
        added.append(_added_lines(repo, new_files))
        overridden.append(overrides)
    out = work / "out"
    _git(repo, "format-patch", "--zero-commit", "--no-signature", "-N", "--filename-max-length=200",
         "-o", str(out), f"HEAD~{len(patches)}")
    for f, a, o in zip(sorted(out.glob("*.patch")), added, overridden):
        gen.names.append(f.name)
        gen.texts[f.name] = read_patch_text(f)
        gen.added[f.name], gen.overrides[f.name] = a, o
    return gen


def _readme(stack: Stack, gen: Generated) -> str:
    total = sum(sum(a.values()) for a in gen.added.values())
    lines = [
        f"# torch {gen.version} series",
        "",
        "Generated by `python -m torch_fork_overlay generate` from the one source in `fix/`",
        "(see `fix/README.md`); do not edit this folder by hand.",
        "",
        f"Lines added to existing PyTorch files: {total} in all.",
        "",
        "| patch | adds to existing files |",
        "| --- | --- |",
    ]
    for name in gen.names:
        added = gen.added[name]
        where = ", ".join(f"`{f}` {n}" for f, n in sorted(added.items())) or "none (new files only)"
        lines.append(f"| `{name}` | {sum(added.values())}: {where} |")
    notes = [f"- `{p.id}`: {p.note}" for p in stack.patches if p.note and p.applies_to(gen.version)]
    if notes:
        lines += ["", "Notes on the patches (`note` in `fix/stack.toml`):", "", *notes]
    lines += ["", f"How it differs from the {stack.newest} series:", ""]
    diffs = [f"- `{name}`, `{h.target}`: {h.why() or 'this release keeps the file as it is'}"
             for name in gen.names for h in gen.overrides[name]]
    diffs += [f"- no `{pid}` patch: this release is outside its range in `fix/stack.toml`"
              for pid in gen.skipped]
    diffs += [f"- `{p.compat}` from `fix/compat/{_compat_source(stack.fix, gen.version).name}`"
              for p in stack.patches if p.compat and p.applies_to(gen.version)]
    lines += diffs if gen.version != stack.newest else ["- (this is the newest series)"]
    return "\n".join(lines) + "\n"


def _same(a: str | None, b: str) -> bool:
    return a is not None and _VOLATILE.sub("", a) == _VOLATILE.sub("", b)


def generate(*, versions: list[str] | None = None, cache_dir: Path, patches_dir=None,
             check: bool = False, fix: Path = FIX, tests_root: Path = ROOT,
             pristine_for=None, out=print) -> list[str]:
    """Regenerate the series of ``versions`` (default: every release of the
    stack). With ``check``, change nothing and return the releases whose
    series in ``patches/`` differ from what the source generates.
    ``pristine_for(version)`` gives a release's pristine files (default: its
    official wheel in ``cache_dir``)."""
    stack = load_stack(fix)
    pristine_for = pristine_for or (lambda v: _pristine_for(v, cache_dir))
    root = _root(patches_dir)
    stale = []
    for version in versions or stack.releases:
        if version not in stack.releases:
            raise OverlayError(f"torch {version} is not a release of fix/stack.toml",
                               cause=f"its releases are {', '.join(stack.releases)}",
                               next="pass one of them, or add the release to fix/stack.toml")
        out(f"==> torch {version}")
        pristine = pristine_for(version)
        with tempfile.TemporaryDirectory(prefix="tfo-generate-") as tmp:
            gen = build_series(stack=stack, version=version, pristine=pristine,
                               tests_root=tests_root, work=Path(tmp))
            gen.readme = _readme(stack, gen)
            target = root / f"v{version}"
            old_names = [n for n in (target / SERIES).read_text().split() if n.endswith(".patch")] \
                if (target / SERIES).is_file() else []
            changed = [n for n in gen.names
                       if not _same((target / n).read_text(encoding="utf-8")
                                    if (target / n).is_file() else None, gen.texts[n])]
            readme_changed = not (target / README).is_file() or (target / README).read_text() != gen.readme
            if check:
                if changed or old_names != gen.names or readme_changed:
                    stale.append(version)
                    out(f"    out of date: {', '.join(changed or ['series/README'])}")
                continue
            with _locked(root):
                cand = _Candidate(Path(tmp) / "cand", root=root, version=version)
                for n in old_names:
                    if n not in gen.names:
                        cand.delete(n)
                for n in changed:
                    cand.write(n, gen.texts[n])
                cand.write(SERIES, "# Patches in apply order (quilt style; '#' starts a comment).\n"
                           "# Generated by `python -m torch_fork_overlay generate` from fix/; "
                           "do not edit.\n" + "\n".join(gen.names) + "\n")
                cand.write(README, gen.readme)
                cand.commit(pristine)
        total = sum(sum(a.values()) for a in gen.added.values())
        for name in gen.names:
            ov = [h.target for h in gen.overrides[name]]
            out(f"    {name}: +{sum(gen.added[name].values())} in existing files"
                + (f"; overrides: {', '.join(ov)}" if ov else "")
                + ("" if name not in changed else " (regenerated)"))
        for note in gen.notes:
            out(f"    moved: {note}")
        out(f"    {len(gen.names)} patches, {total} lines added to existing PyTorch files"
            + (f"; not in this release: {', '.join(gen.skipped)}" if gen.skipped else ""))
    return stale
