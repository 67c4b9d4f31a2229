"""
What the fake-call support needs from this release of PyTorch, in its own
words. See Note [Inheriting the ambient FakeTensorMode] in ambient_fake_mode.py.
"""

import torch


def is_non_strict_tracing() -> bool:
    return torch.compiler._is_non_strict_tracing()
