"""MNCL, the Multi-Node Communication Library, for Python: ctypes over libmncl.so.1, NumPy
arrays in and out. See Communicator (its non-blocking Request, and P2POp for batches of sends
and receives), and to_bfloat16_bits / from_bfloat16_bits for bfloat16 data without the ml_dtypes
package. ChainerMN's training helpers: MultiNodeOptimizer, Communicator.bcast_data and
multi_node_mean_grad, Evaluator, multi_node_iterator, Checkpointer, scatter_dataset."""

from ._dtypes import from_bfloat16_bits, to_bfloat16_bits
from ._lib import library_path, version
from .checkpointer import CheckpointError, Checkpointer
from .comm import Communicator, P2POp, Request
from .datasets import (permutation, scatter_dataset, scatter_index, shard_range,
                       synchronized_seed)
from .hierarchical import HierarchicalCommunicator
from .optimizer import ExchangeStats, MultiNodeOptimizer, create_multi_node_optimizer
from .training import Evaluator, bcast_data, multi_node_iterator, multi_node_mean_grad
from .errors import (
    AbortedError,
    BootstrapError,
    InternalError,
    InvalidArgumentError,
    MnclError,
    NotSupportedError,
    PluginError,
    RemoteError,
    SystemCallError,
    TimeoutError,
)

__all__ = [
    "Communicator",
    "HierarchicalCommunicator",
    "Checkpointer",
    "CheckpointError",
    "Evaluator",
    "ExchangeStats",
    "MultiNodeOptimizer",
    "create_multi_node_optimizer",
    "bcast_data",
    "multi_node_iterator",
    "multi_node_mean_grad",
    "permutation",
    "scatter_dataset",
    "scatter_index",
    "synchronized_seed",
    "shard_range",
    "P2POp",
    "Request",
    "library_path",
    "version",
    "to_bfloat16_bits",
    "from_bfloat16_bits",
    "MnclError",
    "InvalidArgumentError",
    "NotSupportedError",
    "TimeoutError",
    "RemoteError",
    "AbortedError",
    "PluginError",
    "BootstrapError",
    "SystemCallError",
    "InternalError",
]
__version__ = "0.1.0"
