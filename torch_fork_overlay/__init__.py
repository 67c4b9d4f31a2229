"""torch_fork_overlay: apply this project's patch series to torch.

Run ``python -m torch_fork_overlay --help``.  Modules, one job each:
``errors`` (OverlayError), ``proc`` (subprocesses), ``series`` (patch
series + manifest), ``locate`` (find torch without importing it), ``state``
(hashes, state file, RECORD), ``lock`` (one run per install / patches
folder), ``journal`` (crash-safe changes to an install), ``apply``
(patch_tree, apply/revert an install), ``status``, ``wheel`` (repack the official wheel), ``refresh``
(regenerate patches), ``cli``.
"""

__version__ = "0.1.0"
