"""
What the fake-call support needs from this release of PyTorch, in its own
words. See Note [Inheriting the ambient FakeTensorMode] in ambient_fake_mode.py.
"""


def is_non_strict_tracing() -> bool:
    # torch.compiler._is_non_strict_tracing is new in 2.12. Before it,
    # non-strict export traces under a PROXY mode, which tracer_owns_call
    # checks on its own.
    return False
