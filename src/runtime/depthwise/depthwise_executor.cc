// Placeholder until the depth-wise executor lands (issue 5): the schedule is accepted by the
// API and refused here with a clear error.
#include <fmt/format.h>

#include "runtime/executor.h"

namespace sparsecol::runtime {

std::unique_ptr<Executor> make_depthwise_executor(graph::Graph graph, int, const Options&) {
  throw Error(ErrorCode::kUnsupported,
              fmt::format("{}: the depthwise schedule is not implemented yet", graph.source));
}

std::string describe_depthwise_plan(const graph::Graph& graph, int, const Options&) {
  throw Error(ErrorCode::kUnsupported,
              fmt::format("{}: the depthwise planner is not implemented yet", graph.source));
}

}  // namespace sparsecol::runtime
