"""Reductions by name: MNCL's codes (mncl_op_t) and the names other libraries give them."""

import enum

_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
# Other libraries' names for MNCL's reductions (torch.distributed.ReduceOp.PRODUCT).
_OP_ALIASES = {"product": "prod"}


def _op_name(op):
    """The MNCL name of a reduction given by name ("sum", "prod", "min", "max", "avg"; any
    case; torch's "product") or as an enum member named like one (torch.distributed.ReduceOp.AVG,
    an IntEnum, a str Enum: by its name, never its value: other libraries number the reductions
    otherwise, torch's AVG is 1, MNCL's prod); None for anything else."""
    # An enum member first: a str Enum's value is not its name.
    name = getattr(op, "name", None) if not isinstance(op, str) or isinstance(op, enum.Enum) \
        else op
    if not isinstance(name, str):
        return None
    key = _OP_ALIASES.get(name.lower(), name.lower())
    if key not in _OPS:
        raise ValueError(f"mncl: unknown reduction {op!r} (one of {', '.join(_OPS)}, or an enum "
                         f"member of those names; 'product' is prod)")
    return key
