// The depth-wise schedule: the graph cut into tensor columns (plan/tile_plan.h); each column runs
// tile by tile (image x row block) on a thread team pinned one thread per core, every op of the
// column on the tile in the thread's own tile buffers, and only the column's outputs written to
// memory. Ops outside columns run whole through the layer-by-layer steps (layerwise/steps.h).
// The rows a tile's windows need beyond it (the halo) are either recomputed by every tile
// (TileReuse::kHalo), or kept from the thread's previous tile of the same image when it ran the
// one just before (TileReuse::kRolling: rolling line buffers; the tile queue hands each thread a
// contiguous range of tiles so that it mostly does). Rolling is the default: at batch 1 (4 tiles
// per image) it measured 1.07-1.13x faster than halo recomputation at 1 thread and 1.01-1.15x
// at 2 (mobilenet_v2, resnet50, resnet50_s90; 2-core Zen 3, `sparsecol bench --schedule
// depthwise:halo,depthwise:rolling`); with whole-image tiles (L3 columns at batch 16) both are
// the same code.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "graph/passes.h"
#include "plan/memory_plan.h"
#include "plan/tile_plan.h"
#include "runtime/depthwise/replicas.h"
#include "runtime/depthwise/tile_kernels.h"
#include "runtime/executor.h"
#include "runtime/layerwise/steps.h"
#include "runtime/tile_queue.h"
#include "runtime/topology.h"

namespace sparsecol::runtime {

namespace {

using depthwise::TileArgs;
using plan::kept_rows;

bool verbose_from_env() {
  const char* v = std::getenv("SPARSECOL_VERBOSE");
  return v != nullptr && std::strcmp(v, "0") != 0 && *v != '\0';
}

plan::PlanOptions plan_options(int threads, const Options& options) {
  if (options.cache_budget_bytes < 0 || options.tile_rows < 0 || options.shared_cache_bytes < 0) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("depthwise: cache_budget_bytes ({}), shared_cache_bytes ({}) and "
                    "tile_rows ({}) must be >= 0 (0: chosen from the machine)",
                    options.cache_budget_bytes, options.shared_cache_bytes, options.tile_rows));
  }
  const Topology& machine = machine_topology();
  plan::PlanOptions p;
  // Three quarters of hwloc's L2 per core (512 KiB, a common server L2, if it reports none):
  // the working-set model counts tile buffers, scratch and weights, not the column's inputs and
  // outputs streaming through nor whatever else the core touches. Zen 5 (1 MiB L2), 2 threads,
  // depth-wise vs layer by layer in one process, two processes each: ResNet-50 90% and 95%
  // pruned at batch 1 ran 0.90-0.92x with the whole L2 as the budget, 1.00x with 3/4;
  // MobileNetV2 dense and 80% at batch 1 0.96-0.99x -> 1.00-1.04x; at batch 16 within the
  // noise (ResNet-50 90% 1.24-1.29x -> 1.27-1.33x, dense 1.00-1.03x -> 0.98-1.01x).
  p.cache_budget_bytes = options.cache_budget_bytes > 0  ? options.cache_budget_bytes
                         : machine.l2_bytes_per_core > 0 ? machine.l2_bytes_per_core * 3 / 4
                                                         : 512 * 1024;
  p.shared_cache_bytes =
      options.shared_cache_bytes > 0 ? options.shared_cache_bytes : machine.l3_bytes;
  // The L3 tier (plan/tile_plan.h) only when the budget is the machine's: a budget the user
  // sets is the one every column fits.
  if (options.cache_budget_bytes > 0) p.shared_cache_fraction = 0.0;
  p.sparse_threshold = options.sparse_threshold;
  p.tile_rows = options.tile_rows;
  p.threads = std::max(1, threads);
  p.rolling = options.tile_reuse == TileReuse::kRolling;
  return p;
}

// Where an op of a column reads one of its inputs on a tile.
struct Source {
  enum class Kind { kNone, kMemory, kTile } kind = Kind::kNone;
  int id = -1;  // kMemory: the value; kTile: the producing op of the column
};

class DepthwiseExecutor final : public Executor {
 public:
  DepthwiseExecutor(graph::Graph graph, int threads, const Options& options)
      : graph_(std::move(graph)), threads_(std::max(1, threads)), options_(options) {
    if (threads < 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("depthwise: threads must be >= 1, got {}", threads));
    }
    plan_ = plan::plan_columns(graph_, plan_options(threads_, options_));
    tensors_.resize(graph_.values.size());
    workers_.resize(static_cast<std::size_t>(threads_));
    scratch_.resize(static_cast<std::size_t>(threads_));
    const Topology& machine = machine_topology();
    // Workers beyond the cores would share them anyway: pin only a team that fits.
    pin_ = threads_ <= machine.physical_cores;
    thread_nodes_ = thread_nodes(machine, threads_);
    replicas_ = depthwise::plan_replicas(thread_nodes_, options_.replicate_weights);
    build_units();
    build_kernels();
    for (std::size_t col = 0; col < columns_.size(); ++col) layout_tile_buffers(col);
    plan_buffers();
    if (options_.verbose || verbose_from_env()) {
      std::fprintf(stderr, "%s", plan::describe_plan(graph_, plan_).c_str());
    }
  }

  NamedTensors run(const NamedTensors& inputs) override {
    for (int v : graph_.inputs) tensors_[index(v)] = inputs.at(value(v).name);
    for (int v : owned_outputs_) tensors_[index(v)] = Tensor::zeros(value(v).dtype, dims(v));
    if (profiler_ != nullptr) profiler_->begin_run(threads_);
    layerwise::RunContext ctx{tensors_, threads_, scratch_};
    for (Unit& unit : units_) {
      if (unit.column >= 0) {
        run_column(columns_[static_cast<std::size_t>(unit.column)]);
      } else {
        Profiler::Scope timed(profiler_, 0, graph_.nodes[static_cast<std::size_t>(unit.node)]);
        unit.step->run(ctx);
      }
    }
    NamedTensors outputs;
    for (int v : graph_.outputs) {
      const Tensor& t = tensors_[index(v)];
      outputs[value(v).name] = root_[index(v)] == kOwned ? t : t.clone();
    }
    for (int v : graph_.inputs) tensors_[index(v)] = Tensor();
    for (int v : owned_outputs_) tensors_[index(v)] = Tensor();
    return outputs;
  }

  std::vector<LayerInfo> layers() const override {
    std::vector<LayerInfo> infos;
    for (const Unit& unit : units_) {
      if (unit.column < 0) {
        const graph::Node& node = graph_.nodes[static_cast<std::size_t>(unit.node)];
        infos.push_back(describe_node(graph_, node));
        unit.step->describe(infos.back());
        if (std::find(written_over_.begin(), written_over_.end(), node.outputs[0]) !=
            written_over_.end()) {
          infos.back().implementation += layerwise::kWrittenOverInput;
        }
        continue;
      }
      const ColumnRun& run = columns_[static_cast<std::size_t>(unit.column)];
      for (std::size_t i = 0; i < run.column->ops.size(); ++i) {
        const graph::Node& node = graph_.nodes[static_cast<std::size_t>(run.column->ops[i].node)];
        infos.push_back(describe_node(graph_, node));
        run.kernels[0][i]->describe(infos.back());
        infos.back().implementation =
            fmt::format("column {} ({} rows/tile): {}{}", unit.column, run.column->tile_rows,
                        run.kernels[0][i]->implementation(),
                        run.column->written_over[i] >= 0 ? layerwise::kWrittenOverInput : "");
      }
    }
    return infos;
  }

 private:
  static constexpr int kNotPlanned = -1;  // constant, caller input, or a column's intermediate
  static constexpr int kOwned = -2;       // graph output, allocated per run

  // One column bound to kernels, with the source of every op input.
  struct ColumnRun {
    const plan::Column* column = nullptr;
    // Per weight copy (replicas_), per op.
    std::vector<std::vector<std::unique_ptr<depthwise::TileKernel>>> kernels;
    std::vector<std::vector<Source>> sources;  // per op, per node input
    std::unique_ptr<TileQueue> queue;
    // Op i's tile buffer: its byte offset in a thread's arena, and the distance between its
    // channel planes in floats (fixed per buffer: rows kept from the previous tile stay put
    // while the next tile's rows are computed below them).
    std::vector<int64_t> offset, plane_stride;
    int64_t arena_bytes = 0;
    bool rolling = false;
  };
  // What runs in order: a column, or one node whole.
  struct Unit {
    int column = -1;
    int node = -1;
    std::unique_ptr<layerwise::Step> step;
  };
  // A worker's own memory, grown by the worker itself so that first touch places it on the
  // worker's NUMA node (Linux allocates a page on the node of the thread that first writes it).
  struct Worker {
    std::vector<float> arena;  // tile buffers
  };

  static std::size_t index(int id) { return static_cast<std::size_t>(id); }
  const graph::Value& value(int id) const { return graph_.values[index(id)]; }
  std::vector<int64_t> dims(int id) const { return graph_.concrete_dims(id); }

  void build_units() {
    root_.assign(graph_.values.size(), kNotPlanned);
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (graph_.values[v].constant) tensors_[v] = *graph_.values[v].constant;
      if (graph_.values[v].producer < 0 || graph_.values[v].constant) continue;
      root_[v] = graph_.is_output(static_cast<int>(v)) ? kOwned : static_cast<int>(v);
    }
    columns_.resize(plan_.columns.size());
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      const graph::Node& node = graph_.nodes[n];
      const int col = plan_.column_of[n];
      if (col >= 0) {
        const plan::Column& c = plan_.columns[static_cast<std::size_t>(col)];
        // A column's intermediates live in tile buffers only.
        for (const plan::TileOp& op : c.ops) {
          const bool out =
              std::find(c.outputs.begin(), c.outputs.end(), op.output) != c.outputs.end();
          if (!out) root_[index(op.output)] = kNotPlanned;
        }
        if (c.ops.front().node == static_cast<int>(n)) {
          bind_column(static_cast<std::size_t>(col));
          units_.push_back(Unit{col, static_cast<int>(n), nullptr});
        }
        continue;
      }
      Unit unit{-1, static_cast<int>(n), nullptr};
      std::string why_not;
      if (layerwise::is_view_op(graph_, node) && !graph_.is_output(node.outputs[0])) {
        unit.step = layerwise::make_view_step(graph_, node);
        root_[index(node.outputs[0])] =
            root_[index(node.input(0))] < 0 ? kNotPlanned : root_[index(node.input(0))];
      } else {
        unit.step = layerwise::make_fast_step(graph_, node, options_, &why_not, plan_.column_of);
        if (unit.step == nullptr) unit.step = layerwise::make_reference_step(graph_, node);
        // (Not a column's output: a tile may still read rows of the input, as a halo, that an
        // earlier tile's output would already have replaced.)
        layerwise::place_output_over_input(graph_, n, *unit.step, root_, written_over_);
      }
      units_.push_back(std::move(unit));
    }
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (root_[v] == kOwned) owned_outputs_.push_back(static_cast<int>(v));
    }
  }

  void bind_column(std::size_t col) {
    const plan::Column& c = plan_.columns[col];
    ColumnRun& run = columns_[col];
    run.column = &c;
    for (const plan::TileOp& op : c.ops) {
      const graph::Node& node = graph_.nodes[static_cast<std::size_t>(op.node)];
      std::vector<Source> sources(node.inputs.size());
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        const int v = node.inputs[j];
        if (v < 0 || op.inputs[j].kind == plan::RowMap::Kind::kNone) continue;
        sources[j] = {Source::Kind::kMemory, v};
        for (std::size_t k = 0; k < c.ops.size(); ++k) {
          if (c.ops[k].output == v) sources[j] = {Source::Kind::kTile, static_cast<int>(k)};
        }
      }
      run.sources.push_back(std::move(sources));
    }
    run.queue = std::make_unique<TileQueue>(thread_nodes_, c.batch, c.tiles_per_image);
  }

  // The columns' kernels (their packed weights), once per copy of replicas_: each copy built by
  // a thread bound to a core of its node, so that its pages land there; one copy: here.
  void build_kernels() {
    const auto copies = static_cast<std::size_t>(replicas_.replicas());
    auto build = [&](std::size_t copy) {
      for (ColumnRun& run : columns_) {
        const plan::Column& c = *run.column;
        for (std::size_t i = 0; i < c.ops.size(); ++i) {
          // Input 0 in feature blocks when its producer in the column writes them.
          const Source& x = run.sources[i][0];
          const auto blocks = [&](bool b) {
            return b ? kernels::TokenLayout::kFeatureBlocks : kernels::TokenLayout::kTokenMajor;
          };
          const kernels::LinearLayouts layouts{
              blocks(x.kind == Source::Kind::kTile &&
                     c.feature_blocks[static_cast<std::size_t>(x.id)]),
              blocks(c.feature_blocks[i])};
          run.kernels[copy].push_back(
              depthwise::make_tile_kernel(graph_, c.ops[i], options_, layouts));
        }
      }
    };
    for (ColumnRun& run : columns_) run.kernels.resize(copies);
    if (copies == 1) return build(0);
    const int cores = std::max(1, machine_topology().physical_cores);
    for (std::size_t r = 0; r < replicas_.builder.size(); ++r) {
      std::exception_ptr failure;
      std::thread builder([&] {
        try {
          pin_current_thread(replicas_.builder[r] % cores);
          build(r);
        } catch (...) {
          failure = std::current_exception();
        }
      });
      builder.join();
      if (failure) std::rethrow_exception(failure);
    }
  }

  // The planner's arena (with PlanOptions::rolling as tile_reuse says), with the buffers shared
  // where a kernel writes over its residual (the kernels decide, so this follows
  // build_kernels); op k's buffer holds its most rows of any tile, so its channel planes are
  // that many rows apart (in whole lines).
  void layout_tile_buffers(std::size_t col) {
    ColumnRun& run = columns_[col];
    plan::Column& c = plan_.columns[col];
    std::vector<bool> may_overwrite;
    for (const auto& kernel : run.kernels[0]) {
      may_overwrite.push_back(kernel->may_overwrite_residual());
    }
    plan::share_residual_buffers(graph_, c, may_overwrite);
    run.rolling = options_.tile_reuse == TileReuse::kRolling;
    run.offset = c.buffer_offset;
    run.arena_bytes = c.arena_bytes;
    run.plane_stride.assign(c.ops.size(), 0);
    for (std::size_t k = 0; k + 1 < c.ops.size(); ++k) {
      int64_t max_rows = 0;
      for (const std::vector<plan::RowRange>& tile : c.rows) {
        max_rows = std::max(max_rows, tile[k].size());
      }
      run.plane_stride[k] = c.ops[k].plane_floats(max_rows);
    }
  }

  // The values in memory (column outputs, outputs of whole nodes) in one arena, planned with
  // the units as steps: a column reads its inputs and writes its outputs during its whole unit.
  void plan_buffers() {
    std::vector<int> unit_of(graph_.nodes.size(), -1);
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const Unit& unit = units_[u];
      if (unit.column < 0) {
        unit_of[index(unit.node)] = static_cast<int>(u);
        continue;
      }
      for (const plan::TileOp& op : columns_[index(unit.column)].column->ops) {
        unit_of[index(op.node)] = static_cast<int>(u);
      }
    }
    std::vector<int> request_of(graph_.values.size(), -1);
    std::vector<int> planned;
    std::vector<plan::BufferRequest> requests;
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (root_[v] != static_cast<int>(v)) continue;
      const int u = unit_of[index(graph_.values[v].producer)];
      const auto size = static_cast<int64_t>(checked_numel(dims(static_cast<int>(v))) *
                                             static_cast<int64_t>(dtype_size(value(v).dtype)));
      request_of[v] = static_cast<int>(requests.size());
      planned.push_back(static_cast<int>(v));
      requests.push_back({size, u, u});
    }
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      for (int v : graph_.nodes[n].inputs) {
        if (v < 0 || root_[index(v)] < 0) continue;
        plan::BufferRequest& r = requests[index(request_of[index(root_[index(v)])])];
        r.last_step = std::max(r.last_step, unit_of[n]);
      }
    }
    const plan::MemoryPlan memory = plan::plan_memory(requests);
    arena_ = plan::allocate_arena(memory.arena_size);
    for (std::size_t b = 0; b < planned.size(); ++b) {
      const int v = planned[b];
      tensors_[index(v)] = Tensor::view(arena_.get() + memory.offsets[b], value(v).dtype, dims(v));
    }
    for (int v : written_over_) {
      const auto b = index(request_of[index(root_[index(v)])]);
      tensors_[index(v)] = Tensor::view(arena_.get() + memory.offsets[b], value(v).dtype, dims(v));
    }
  }

  // Image `image` of a value in memory, seen by the row kernels: the channel planes of an NCHW
  // image, or one token sequence ([batch, tokens, features] or [tokens, features]: one plane).
  kernels::PlaneView image_view(int v, int64_t image) const {
    Tensor& t = const_cast<Tensor&>(tensors_[index(v)]);
    const int64_t per_image = t.numel() / (t.rank() == 2 ? 1 : t.dim(0));
    const int64_t plane = t.rank() == 4 ? t.dim(2) * t.dim(3) : per_image;
    return {t.data<float>() + image * per_image, 0, plane};
  }

  void run_column(ColumnRun& run) {
    run.queue->reset();
    const auto arena_floats = static_cast<std::size_t>(run.arena_bytes / 4 + 16);
#pragma omp parallel num_threads(threads_)
    {
      const int thread = omp_get_thread_num();
      // The caller's own thread (0) is the user's: never rebind it.
      thread_local int pinned_core = -1;
      if (pin_ && thread > 0 && omp_get_num_threads() == threads_ && pinned_core != thread) {
        pinned_core = pin_current_thread(thread) ? thread : -1;
      }
      Worker& worker = workers_[static_cast<std::size_t>(thread)];
      if (worker.arena.size() < arena_floats) worker.arena.resize(arena_floats);
      // The arena's 64-byte aligned start: buffer offsets are multiples of 64.
      float* arena = reinterpret_cast<float*>(
          (reinterpret_cast<std::uintptr_t>(worker.arena.data()) + 63) & ~std::uintptr_t{63});
      run_tiles(run, thread, arena, scratch_[static_cast<std::size_t>(thread)]);
    }
  }

  void run_tiles(ColumnRun& run, int thread, float* arena, std::vector<float>& scratch) {
    const plan::Column& c = *run.column;
    const auto m = c.ops.size();
    TileArgs args;
    args.scratch = &scratch;
    const auto& kernels = run.kernels[static_cast<std::size_t>(
        replicas_.replica_of_thread[static_cast<std::size_t>(thread)])];
    // Op k's tile buffer on tile t.
    auto tile_view = [&](std::size_t k, std::size_t t) {
      return kernels::PlaneView{arena + run.offset[k] / 4, c.rows[t][k].begin, run.plane_stride[k]};
    };
    for (int64_t tile, previous = -1; (tile = run.queue->next(thread)) >= 0; previous = tile) {
      const int64_t image = tile / c.tiles_per_image;
      const auto t = static_cast<std::size_t>(tile % c.tiles_per_image);
      // This thread's buffers hold tile t-1 of the same image: keep what tile t shares with it.
      const bool roll = run.rolling && t > 0 && previous == tile - 1;
      for (std::size_t i = 0; i < m; ++i) {
        const plan::TileOp& op = c.ops[i];
        args.rows = c.rows[t][i];
        if (args.rows.empty()) continue;
        const bool anchor = i + 1 == m;
        if (roll && !anchor) {
          const plan::RowRange kept = kept_rows(c.rows[t - 1][i], args.rows);
          if (!kept.empty()) {
            move_to_top(tile_view(i, t), kept, c.rows[t - 1][i].begin, op);
            args.rows.begin = kept.end;
          }
        }
        const std::vector<Source>& sources = run.sources[i];
        args.inputs.assign(sources.size(), kernels::PlaneView{});
        for (std::size_t j = 0; j < sources.size(); ++j) {
          if (sources[j].kind == Source::Kind::kMemory) {
            args.inputs[j] = image_view(sources[j].id, image);
          } else if (sources[j].kind == Source::Kind::kTile) {
            args.inputs[j] = tile_view(static_cast<std::size_t>(sources[j].id), t);
          }
        }
        args.output = anchor ? image_view(op.output, image) : tile_view(i, t);
        if (!args.rows.empty()) {
          Profiler::Scope timed(profiler_, thread, graph_.nodes[static_cast<std::size_t>(op.node)],
                                static_cast<int>(tile));
          kernels[i]->run(args);
        }
        if (!anchor && c.is_output(static_cast<int>(i))) {
          copy_rows(args.output, image_view(op.output, image), c.own[t][i], op);
        }
      }
    }
  }

  // Rows `kept` of every channel of a tile buffer, laid out from row `row0` (the previous tile's
  // first), moved to where `buffer` (from kept.begin) puts them.
  static void move_to_top(const kernels::PlaneView& buffer, plan::RowRange kept, int64_t row0,
                          const plan::TileOp& op) {
    const int64_t shift = (kept.begin - row0) * op.width;
    if (shift == 0) return;
    const auto bytes = static_cast<std::size_t>(kept.size() * op.width) * sizeof(float);
    for (int64_t ch = 0; ch < op.channels; ++ch) {
      float* plane = buffer.data + ch * buffer.plane_stride;
      std::memmove(plane, plane + shift, bytes);
    }
  }

  // Rows `rows` of every channel from a tile buffer to memory (an output read after the column).
  static void copy_rows(const kernels::PlaneView& from, const kernels::PlaneView& to,
                        plan::RowRange rows, const plan::TileOp& op) {
    if (rows.empty()) return;
    const auto bytes = static_cast<std::size_t>(rows.size() * op.width) * sizeof(float);
    for (int64_t ch = 0; ch < op.channels; ++ch) {
      std::memcpy(to.data + ch * to.plane_stride + (rows.begin - to.row0) * op.width,
                  from.data + ch * from.plane_stride + (rows.begin - from.row0) * op.width, bytes);
    }
  }

  graph::Graph graph_;
  int threads_;
  Options options_;
  plan::TilePlan plan_;
  bool pin_ = false;
  std::vector<int> thread_nodes_;    // NUMA node of each worker
  depthwise::ReplicaPlan replicas_;  // which copy of the weights each worker reads
  std::vector<Tensor> tensors_;      // by value id: arena views, constants, inputs/outputs per run
  std::vector<int> root_;            // value whose buffer a value lives in, or kNotPlanned/kOwned
  // Outputs of whole nodes placed in the buffer of an input their step writes over.
  std::vector<int> written_over_;
  std::vector<int> owned_outputs_;
  std::vector<ColumnRun> columns_;  // per plan column
  std::vector<Unit> units_;         // in graph order
  plan::Arena arena_;
  std::vector<Worker> workers_;  // per thread
  // Per thread kernel scratch, one for the columns' tile kernels and the whole-node steps alike
  // (they never run at once).
  std::vector<std::vector<float>> scratch_;
};

}  // namespace

std::unique_ptr<Executor> make_depthwise_executor(graph::Graph graph, int threads,
                                                  const Options& options) {
  graph::fold_matmul_transposes(graph);
  return std::make_unique<DepthwiseExecutor>(std::move(graph), threads, options);
}

std::string describe_depthwise_plan(graph::Graph graph, int threads, const Options& options) {
  graph::fold_matmul_transposes(graph);  // the graph the executor plans
  return plan::describe_plan(graph, plan::plan_columns(graph, plan_options(threads, options)));
}

}  // namespace sparsecol::runtime
