# Owner(s): ["module: dynamo"]
"""
State that a compiled call creates while it is traced (an optimizer's, made by
a compiled step) is owned by the user's FakeTensorMode, as in eager.
See Note [Inheriting the ambient FakeTensorMode] in
torch/_dynamo/ambient_fake_mode.py
"""

import torch
import torch._dynamo.test_case
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


try:
    from .test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
    )
except ImportError:
    from test_compile_under_fake_mode import (
        BACKENDS,
        CompileUnderFakeModeTestCase,
    )


class CompileUnderFakeModeOptimizerTests(CompileUnderFakeModeTestCase):
    # State that a compiled call creates while it is traced (an
    # optimizer's) is owned by the user's mode, as in eager.
    @parametrize("backend", BACKENDS)
    def test_optimizer_state_created_by_compiled_step(self, backend):
        mode = FakeTensorMode()
        with mode:
            model = torch.nn.Linear(4, 4)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            model(torch.randn(2, 4)).sum().backward()
            torch.compile(opt.step, backend=backend)()
            for state in opt.state.values():
                self.assertEqual(set(state), {"step", "exp_avg", "exp_avg_sq"})
                for value in state.values():
                    self.assertIsInstance(value, FakeTensor)
                    self.assertIs(value.fake_mode, mode)
            # The next steps use that state, eagerly and compiled.
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            torch.compile(opt.step, backend=backend)()


instantiate_parametrized_tests(CompileUnderFakeModeOptimizerTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
