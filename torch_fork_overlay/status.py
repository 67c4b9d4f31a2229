"""``status``: what torch is installed, which series serves it (decided by
hashes, see ``releases``) and how it stands against that series, including a
run in progress or one that was interrupted (see ``journal``)."""

from __future__ import annotations

import os

from . import journal as jn
from . import lock
from . import state as st
from .apply import serving_of
from .errors import OverlayError
from .locate import TorchInstall, locate
from .releases import NONE
from .series import supported_versions


def status_report(
    *,
    python: str | None = None,
    site_packages: str | os.PathLike[str] | None = None,
    patches_dir: str | os.PathLike[str] | None = None,
) -> str:
    inst = locate(python=python, site_packages=site_packages)
    lines = [
        f"torch:         {inst.version}",
        f"git_version:   {inst.git_version}",
        f"path:          {inst.torch_dir}",
        f"dist-info:     {inst.dist_info or '(none: not installed by pip)'}",
    ]
    try:
        serving = serving_of(inst, patches_dir=patches_dir)
    except OverlayError as e:
        series = None
        lines.append(f"series:        none for {inst.version} "
                     f"(supported: {', '.join(supported_versions(patches_dir)) or 'none'})")
        lines.append(f"               {e.what}")
    else:
        series = serving.series
        lines.append(f"series:        {series.dir} ({len(series.patches)} patch(es), "
                     f"{len(series.install_patches())} for installs)")
        lines.append(f"served by:     {serving.describe()}")
        if serving.match == NONE:
            lines.append("               (the files marked unknown below differ; apply refuses this install)")
    _run_lines(inst, lines, sorted(series.manifest) if series else [])
    if series is None:
        return "\n".join(lines)
    lines.append("files:")
    for rel in series.install_files():
        v = series.manifest[rel]
        s = st.classify(inst.site_packages / rel, pristine=v["pristine"], patched=v["patched"])
        lines.append(f"  {s:<9} {rel}")
    return "\n".join(lines)


def _run_lines(inst: TorchInstall, lines: list[str], rels: list[str]) -> None:
    """State file, journal, lock and leftovers of interrupted runs."""
    args = f"--site-packages {inst.site_packages}"
    try:
        state = st.read_state(inst.torch_dir, reinstall=inst.reinstall)
        lines.append(f"state file:    {st.state_path(inst.torch_dir) if state else '(none)'}")
        rels = sorted(set(rels) | set(state["files"] if state else []))
    except OverlayError as e:
        lines.append(f"state file:    {e.what}")
    lock_path = inst.site_packages / st.LOCK_NAME
    held = lock.held_elsewhere(lock_path)
    try:
        plan = jn.read_journal(inst)
    except OverlayError as e:
        lines.append(f"journal:       {e.what}")
        lines.append(f"               next: {e.next}")
        return
    if plan is not None:
        rels = sorted(set(rels) | set(plan.files))
        if held:
            lines.append(f"journal:       {plan.op} in progress: another torch_fork_overlay run holds "
                         f"{lock_path}")
        else:
            lines.append(f"journal:       interrupted {plan.op}: {plan.journal} was left by a run "
                         "that was killed or crashed before it finished")
            lines.append(f"               next: python -m torch_fork_overlay revert {args}"
                         "   (rolls it back to pristine)")
            lines.append(f"                 or: python -m torch_fork_overlay apply {args}"
                         "    (rolls it back, then applies the series)")
    elif held:
        lines.append(f"lock:          another torch_fork_overlay run holds {lock_path} now")
    found = [] if held else jn.leftovers(inst, rels)
    if found:
        lines.append(f"leftovers:     {len(found)} temp file(s) of an interrupted run, removed by the "
                     f"next apply or revert: {', '.join(str(p) for p in found)}")
