// MNCL's C++ frontends in one include: the communicator wrapper and the ChainerMN-style tools
// built on it, all on the public C API (mncl.h) alone.
#ifndef MNCL_FRONTENDS_HPP
#define MNCL_FRONTENDS_HPP

#include "mncl/frontends/agreement.hpp"
#include "mncl/frontends/batch_norm.hpp"
#include "mncl/frontends/chain_list.hpp"
#include "mncl/frontends/checkpointer.hpp"
#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/dataset.hpp"
#include "mncl/frontends/dtype.hpp"
#include "mncl/frontends/error.hpp"
#include "mncl/frontends/evaluator.hpp"
#include "mncl/frontends/hierarchical.hpp"
#include "mncl/frontends/hybrid.hpp"
#include "mncl/frontends/links.hpp"
#include "mncl/frontends/multi_node_optimizer.hpp"
#include "mncl/frontends/optimizer.hpp"
#include "mncl/frontends/prefetch_loader.hpp"
#include "mncl/frontends/serialize.hpp"
#include "mncl/frontends/span.hpp"
#include "mncl/frontends/tensor_parallel.hpp"

#endif  // MNCL_FRONTENDS_HPP
