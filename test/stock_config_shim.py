"""pytest plugin for running the contract tests on stock torch (the counterfactual).

The contract tests set the patch's switches in ``torch._dynamo.config``
(``fake_mode_region_after_calls`` in the regions tests, ``inherit_ambient_fake_mode`` in the
counterfactual tests); stock torch has none of them, so every test would fail
in setUp for that reason alone. This plugin makes ``config.patch`` drop exactly
those switches when torch lacks them: stock then fails (or passes) for what it
does, which is what test/test_stock_shows_the_bug.py checks. Loaded with
``-p stock_config_shim`` by that test only; never used on a patched torch.
"""

from __future__ import annotations

SWITCHES = {"inherit_ambient_fake_mode", "compile_backend_under_fake_mode", "fake_mode_region_after_calls"}


def pytest_configure(config):
    import torch._dynamo.config as dynamo_config

    missing = {name for name in SWITCHES if not hasattr(dynamo_config, name)}
    if not missing:
        return
    # Config modules refuse new attributes: wrap patch on their class, for
    # this one module only.
    config_module_type = type(dynamo_config)
    patch = config_module_type.patch

    def patch_without_missing_switches(self, arg1=None, arg2=None, **kwargs):
        if self is dynamo_config:
            if isinstance(arg1, str) and arg1 in missing:
                arg1, arg2 = None, None
            if isinstance(arg1, dict):
                arg1 = {k: v for k, v in arg1.items() if k not in missing}
            kwargs = {k: v for k, v in kwargs.items() if k not in missing}
        return patch(self, arg1, arg2, **kwargs)

    config_module_type.patch = patch_without_missing_switches
