"""Install the torch_fork_overlay tool (console script ``torch-fork-overlay``).

Environment variables honoured by the tool (not by this file):

  TORCH_FORK_OVERLAY_PATCHES
      folder of ``v<release>/`` patch series (default: ``patches/`` of the
      source checkout, else the copy shipped inside the package)
  TORCH_FORK_OVERLAY_CACHE
      download cache of ``wheel --version`` (default: ``./.cache``)
  TORCH_FORK_OVERLAY_LOG_DIR
      where failed commands leave their full log (default: $TMPDIR/torch-fork-overlay-logs)
  TORCH_FORK_OVERLAY_LOCK_TIMEOUT
      seconds an apply / revert / refresh waits for another run on the same
      install or patches folder before refusing (default: 60)
  TFO_FAULT_AT, TFO_FAULT_LOG
      fault injection for the tests only (see torch_fork_overlay/journal.py)

Environment variables honoured by the tests (test/):

  TORCH_FORK_OVERLAY_STOCK_PYTHON, TORCH_FORK_OVERLAY_PATCHED_PYTHON
      interpreters of the stock and the patched venv (set by tools/test)
  TORCH_FORK_OVERLAY_WHEEL
      the official torch wheel used by the wheel tests (default: .cache/wheels/torch-2.15.0-*.whl)
  TORCH_FORK_OVERLAY_RELEASES
      releases tools/test-releases runs, e.g. "2.9.1 2.13.0" (default: every patches/v<release>/
      but the default release, which tools/test covers)

The patch series under ``patches/`` is shipped as package data
(``torch_fork_overlay/_patches``), so an installed tool works outside the
checkout.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class build_py_with_patches(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "torch_fork_overlay", "_patches")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(os.path.join(ROOT, "patches"), dest)


setup(
    name="torch-fork-overlay",
    version="0.1.0",
    description="Apply this project's patch series to torch: patch an install or build a patched wheel",
    packages=["torch_fork_overlay"],
    package_data={"torch_fork_overlay": ["suites.toml"]},
    python_requires=">=3.11",
    # filelock>=4.3: release leaves the lock file alone and acquire re-checks
    # st_nlink after flock, which lock.py relies on (see its docstring)
    install_requires=["filelock>=4.3", "packaging", "wheel>=0.48"],
    cmdclass={"build_py": build_py_with_patches},
    entry_points={"console_scripts": ["torch-fork-overlay = torch_fork_overlay.cli:main"]},
)
