"""``status``: what torch is installed and how it stands against our series."""

from __future__ import annotations

import os

from . import state as st
from .errors import OverlayError
from .locate import locate
from .series import load_series, supported_versions


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
        series = load_series(inst.version, patches_dir=patches_dir)
    except OverlayError as e:
        lines.append(f"series:        none for {inst.base_version} "
                     f"(supported: {', '.join(supported_versions(patches_dir)) or 'none'})")
        lines.append(f"               {e.what}")
        return "\n".join(lines)
    lines.append(f"series:        {series.dir} ({len(series.patches)} patch(es), "
                 f"{len(series.install_patches())} for installs)")
    state = st.read_state(inst.torch_dir)
    lines.append(f"state file:    {st.state_path(inst.torch_dir) if state else '(none)'}")
    lines.append("files:")
    for rel in series.install_files():
        v = series.manifest[rel]
        s = st.classify(inst.site_packages / rel, pristine=v["pristine"], patched=v["patched"])
        lines.append(f"  {s:<9} {rel}")
    return "\n".join(lines)
