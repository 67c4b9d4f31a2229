# mypy: allow-untyped-defs
from torch._C import DispatchKey
from torch._higher_order_ops.utils import register_fake
from torch._ops import HigherOrderOperator
from torch.fx import GraphModule


class FakeModeRegion(HigherOrderOperator):
    """
    Runs a graph as one op under FakeTensorMode, whose dispatch cache then
    replays the whole graph from its inputs' metadata (keyed on the graph
    module, and evicted when it dies). Dynamo calls graphs compiled for a
    user's FakeTensorMode this way once they are hot; callers handle autograd.
    See Note [Inheriting the ambient FakeTensorMode] in
    torch/_dynamo/ambient_fake_mode.py
    """

    def __init__(self) -> None:
        super().__init__("fake_mode_region", cacheable=True)

    def __call__(self, subgraph: GraphModule, *operands):
        return super().__call__(subgraph, *operands)


fake_mode_region = FakeModeRegion()
# The ops of the graph handle these keys themselves when it runs.
fake_mode_region.fallthrough(DispatchKey.Conjugate)
fake_mode_region.fallthrough(DispatchKey.Negative)
fake_mode_region.fallthrough(DispatchKey.ZeroTensor)


@fake_mode_region.py_impl(DispatchKey.CompositeExplicitAutograd)
def fake_mode_region_dense(subgraph, *operands):
    return subgraph(*operands)


@register_fake(fake_mode_region)
def fake_mode_region_fake(subgraph, *operands):
    return subgraph(*operands)
