"""
What the fake-call support needs from this release of PyTorch, in its own
words. See Note [Inheriting the ambient FakeTensorMode] in ambient_fake_mode.py.
"""

import torch
from torch.utils._python_dispatch import (
    any_torch_dispatch_mode_on_stack,
    is_in_any_mode_without_ignore_compile_internals,
)

from . import config


def is_non_strict_tracing() -> bool:
    return torch.compiler._is_non_strict_tracing()


def dynamo_skips_for_dispatch_mode() -> bool:
    # As CatchErrorsWrapper decides it.
    if config.inline_torch_dispatch_torch_compile:
        return any_torch_dispatch_mode_on_stack()
    return is_in_any_mode_without_ignore_compile_internals()


# What Dynamo's callbacks and backend wrappers name the callable they wrap:
# Dynamo's cache lookup follows it to the backend a cache entry is keyed by.
WRAPPED_BACKEND_ATTR = "_torchdynamo_orig_backend"


# Whether guards carry the user stack that added them (add_lambda_guard takes
# it), from 2.11 on.
GUARDS_HAVE_USER_STACKS = True
