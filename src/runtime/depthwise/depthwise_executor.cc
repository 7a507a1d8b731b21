// The depth-wise schedule: the graph cut into tensor columns (plan/tile_plan.h); each column runs
// tile by tile (image x row block) on a thread team pinned one thread per core, every op of the
// column on the tile in the thread's own tile buffers, and only the column's outputs written to
// memory. Ops outside columns run whole through the layer-by-layer steps (layerwise/steps.h).
// Whether the columns pay is the planner's estimate from cache sizes; the first runs check it
// (Options::measure_columns): the columns run as tiles and with their ops whole on alternate
// runs, and then the faster way (see Columns).
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
#include <chrono>
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

// The plan as text, and how its columns will run.
std::string plan_text(const graph::Graph& graph, const plan::TilePlan& plan,
                      const Options& options) {
  std::string text = plan::describe_plan(graph, plan);
  if (options.measure_columns && !plan.columns.empty()) {
    text += fmt::format(
        "the columns run as tiles, or with their ops whole where the first {} runs measure that "
        "faster (Options::measure_columns)\n",
        kColumnMeasuringRuns);
  }
  return text;
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
    if (columns_mode_ == Columns::kMeasuring) {
      place(/*whole=*/true);
      whole_placed_ = std::move(placed_);
    }
    place(/*whole=*/false);
    if (options_.verbose || verbose_from_env()) {
      std::fprintf(stderr, "%s", plan_text(graph_, plan_, options_).c_str());
    }
  }

  NamedTensors run(const NamedTensors& inputs) override {
    if (columns_mode_ != Columns::kMeasuring)
      return run_placed(inputs, columns_mode_ == Columns::kWhole);
    const bool whole = measured_runs_ % 2 == 1;
    const auto start = std::chrono::steady_clock::now();
    NamedTensors outputs;
    if (whole) {
      // In the placement for the columns' ops whole, and back whatever happens.
      struct Swapped {
        Placement &a, &b;
        ~Swapped() { std::swap(a, b); }
      } swapped{placed_, whole_placed_};
      std::swap(placed_, whole_placed_);
      outputs = run_placed(inputs, true);
    } else {
      outputs = run_placed(inputs, false);
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    record_measured_run(whole, took.count());
    return outputs;
  }

  std::vector<LayerInfo> layers() const override {
    std::vector<LayerInfo> infos;
    for (const Unit& unit : units_) {
      if (unit.column < 0) {
        const graph::Node& node = graph_.nodes[static_cast<std::size_t>(unit.node)];
        infos.push_back(describe_node(graph_, node));
        unit.step->describe(infos.back());
        if (written_over(node)) infos.back().implementation += layerwise::kWrittenOverInput;
        continue;
      }
      const ColumnRun& run = columns_[static_cast<std::size_t>(unit.column)];
      for (std::size_t i = 0; i < run.column->ops.size(); ++i) {
        const graph::Node& node = graph_.nodes[static_cast<std::size_t>(run.column->ops[i].node)];
        infos.push_back(describe_node(graph_, node));
        if (columns_mode_ == Columns::kWhole) {
          run.whole[i]->describe(infos.back());
          infos.back().implementation = fmt::format(
              "whole (measured faster than column {}'s tiles): {}{}", unit.column,
              infos.back().implementation, written_over(node) ? layerwise::kWrittenOverInput : "");
          continue;
        }
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
  // One run in placed_, with the columns as tiles or their ops `whole`.
  NamedTensors run_placed(const NamedTensors& inputs, bool whole) {
    for (int v : graph_.inputs) placed_.tensors[index(v)] = inputs.at(value(v).name);
    for (int v : placed_.owned_outputs) {
      placed_.tensors[index(v)] = Tensor::zeros(value(v).dtype, dims(v));
    }
    if (profiler_ != nullptr) profiler_->begin_run(threads_);
    layerwise::RunContext ctx{placed_.tensors, threads_, scratch_};
    for (Unit& unit : units_) {
      if (unit.column < 0) {
        Profiler::Scope timed(profiler_, 0, graph_.nodes[index(unit.node)]);
        unit.step->run(ctx);
        continue;
      }
      ColumnRun& run = columns_[index(unit.column)];
      if (!whole) {
        run_column(run);
        continue;
      }
      for (std::size_t i = 0; i < run.whole.size(); ++i) {
        Profiler::Scope timed(profiler_, 0, graph_.nodes[index(run.column->ops[i].node)]);
        run.whole[i]->run(ctx);
      }
    }
    NamedTensors outputs;
    for (int v : graph_.outputs) {
      const Tensor& t = placed_.tensors[index(v)];
      outputs[value(v).name] = placed_.root[index(v)] == kOwned ? t : t.clone();
    }
    for (int v : graph_.inputs) placed_.tensors[index(v)] = Tensor();
    for (int v : placed_.owned_outputs) placed_.tensors[index(v)] = Tensor();
    return outputs;
  }

  static constexpr int kNotPlanned = -1;  // constant, caller input, or a column's intermediate
  static constexpr int kOwned = -2;       // graph output, allocated per run

  // How the columns run (Options::measure_columns): as tiles, or every column's ops whole (as
  // layer by layer), or not decided yet: the two ways on alternate runs, each in a placement of
  // its own (whole ops write over residuals, and reuse buffers op by op, as layer by layer),
  // until each way has kMeasuredRuns timed runs after one untimed (first touches of its
  // buffers), then the way with the faster median. Whole runs, not columns, are timed and
  // chosen: a column's time depends on how the column before it wrote its input (rows per
  // thread as tiles, channel blocks whole), and column by column choices timed with every column
  // run the same way mixed ways never timed together (MobileNetV2 at batch 1 ran 3% slower).
  // On a 2-core Emerald Rapids VM at batch 1, ResNet-50 90% ran 0.91-0.93x of layer by layer as
  // tiles and 0.97-1.02x measured (its ops whole); MobileNetV2 kept its tiles (docs/BENCHMARKS.md).
  enum class Columns { kMeasuring, kTiles, kWhole };
  static constexpr std::size_t kMeasuredRuns = (kColumnMeasuringRuns - 2) / 2;

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
    // The column's ops as whole steps (Options::measure_columns).
    std::vector<std::unique_ptr<layerwise::Step>> whole;
  };
  // What runs in order: a column, or one node whole.
  struct Unit {
    int column = -1;
    int node = -1;
    std::unique_ptr<layerwise::Step> step;
  };
  // Where the values in memory live, for one way of running the columns.
  struct Placement {
    std::vector<Tensor> tensors;  // by value id: arena views, constants, inputs/outputs per run
    std::vector<int> root;        // value whose buffer a value lives in, or kNotPlanned/kOwned
    // Outputs of whole nodes placed in the buffer of an input their step writes over.
    std::vector<int> written_over;
    std::vector<int> owned_outputs;
    plan::Arena arena;
  };
  // A worker's own memory, grown by the worker itself so that first touch places it on the
  // worker's NUMA node (Linux allocates a page on the node of the thread that first writes it).
  struct Worker {
    std::vector<float> arena;  // tile buffers
  };

  static std::size_t index(int id) { return static_cast<std::size_t>(id); }
  const graph::Value& value(int id) const { return graph_.values[index(id)]; }
  std::vector<int64_t> dims(int id) const { return graph_.concrete_dims(id); }
  bool written_over(const graph::Node& node) const {
    return std::find(placed_.written_over.begin(), placed_.written_over.end(), node.outputs[0]) !=
           placed_.written_over.end();
  }

  void build_units() {
    columns_.resize(plan_.columns.size());
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      const graph::Node& node = graph_.nodes[n];
      const int col = plan_.column_of[n];
      std::string why_not;
      if (col < 0) {
        units_.push_back(
            Unit{-1, static_cast<int>(n),
                 layerwise::make_whole_step(graph_, node, options_, &why_not, plan_.column_of)});
        continue;
      }
      const plan::Column& c = plan_.columns[static_cast<std::size_t>(col)];
      if (c.ops.front().node == static_cast<int>(n)) {
        bind_column(static_cast<std::size_t>(col));
        units_.push_back(Unit{col, static_cast<int>(n), nullptr});
      }
      if (options_.measure_columns) {
        columns_mode_ = Columns::kMeasuring;
        columns_[static_cast<std::size_t>(col)].whole.push_back(
            layerwise::make_whole_step(graph_, node, options_, &why_not, plan_.column_of));
      }
    }
  }

  // placed_ anew for the columns as tiles, or their ops whole.
  void place(bool whole) {
    place_values(whole);
    plan_buffers(whole);
  }

  // The buffer each value lives in (placed_.root): a whole node's output where
  // layerwise::place_output puts it, and so for the ops of a column run whole. A column run as
  // tiles keeps its intermediates in tile buffers only, and writes no output over an input: a
  // tile may still read rows of the input, as a halo, that an earlier tile's output would
  // already have replaced.
  void place_values(bool whole) {
    placed_.root.assign(graph_.values.size(), kNotPlanned);
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (graph_.values[v].producer < 0 || graph_.values[v].constant) continue;
      placed_.root[v] = graph_.is_output(static_cast<int>(v)) ? kOwned : static_cast<int>(v);
    }
    placed_.written_over.clear();
    for (const Unit& unit : units_) {
      if (unit.column < 0) {
        layerwise::place_output(graph_, index(unit.node), *unit.step, placed_.root,
                                placed_.written_over);
        continue;
      }
      const ColumnRun& run = columns_[index(unit.column)];
      const plan::Column& c = *run.column;
      for (std::size_t i = 0; i < c.ops.size(); ++i) {
        if (whole) {
          layerwise::place_output(graph_, index(c.ops[i].node), *run.whole[i], placed_.root,
                                  placed_.written_over);
        } else if (!c.is_output(static_cast<int>(i))) {
          placed_.root[index(c.ops[i].output)] = kNotPlanned;
        }
      }
    }
    placed_.owned_outputs.clear();
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (placed_.root[v] == kOwned) placed_.owned_outputs.push_back(static_cast<int>(v));
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

  // The values in memory (column outputs, outputs of whole nodes; intermediates of columns
  // not run as tiles) in one arena, planned in steps: one per node run whole (in a column run
  // whole, too: as layer by layer, a buffer is free again once its last reader ran), one per
  // column otherwise, which reads its inputs and writes its outputs from its first tile to its
  // last (and while measured, either way).
  void plan_buffers(bool whole) {
    std::vector<int> step_of(graph_.nodes.size(), -1);
    int step = 0;
    for (const Unit& unit : units_) {
      if (unit.column < 0) {
        step_of[index(unit.node)] = step++;
        continue;
      }
      for (const plan::TileOp& op : columns_[index(unit.column)].column->ops) {
        step_of[index(op.node)] = whole ? step++ : step;
      }
      if (!whole) ++step;
    }
    std::vector<int> request_of(graph_.values.size(), -1);
    std::vector<int> planned;
    std::vector<plan::BufferRequest> requests;
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (placed_.root[v] != static_cast<int>(v)) continue;
      const int u = step_of[index(graph_.values[v].producer)];
      const auto size = static_cast<int64_t>(checked_numel(dims(static_cast<int>(v))) *
                                             static_cast<int64_t>(dtype_size(value(v).dtype)));
      request_of[v] = static_cast<int>(requests.size());
      planned.push_back(static_cast<int>(v));
      requests.push_back({size, u, u});
    }
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      for (int v : graph_.nodes[n].inputs) {
        if (v < 0 || placed_.root[index(v)] < 0) continue;
        plan::BufferRequest& r = requests[index(request_of[index(placed_.root[index(v)])])];
        r.last_step = std::max(r.last_step, step_of[n]);
      }
    }
    const plan::MemoryPlan memory = plan::plan_memory(requests);
    placed_.tensors.assign(graph_.values.size(), Tensor());
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (graph_.values[v].constant) placed_.tensors[v] = *graph_.values[v].constant;
    }
    placed_.arena = plan::allocate_arena(memory.arena_size);
    for (std::size_t b = 0; b < planned.size(); ++b) {
      const int v = planned[b];
      placed_.tensors[index(v)] =
          Tensor::view(placed_.arena.get() + memory.offsets[b], value(v).dtype, dims(v));
    }
    for (int v : placed_.written_over) {
      const auto b = index(request_of[index(placed_.root[index(v)])]);
      placed_.tensors[index(v)] =
          Tensor::view(placed_.arena.get() + memory.offsets[b], value(v).dtype, dims(v));
    }
  }

  // Image `image` of a value in memory, seen by the row kernels: the channel planes of an NCHW
  // image, or one token sequence ([batch, tokens, features] or [tokens, features]: one plane).
  kernels::PlaneView image_view(int v, int64_t image) const {
    Tensor& t = const_cast<Tensor&>(placed_.tensors[index(v)]);
    const int64_t per_image = t.numel() / (t.rank() == 2 ? 1 : t.dim(0));
    const int64_t plane = t.rank() == 4 ? t.dim(2) * t.dim(3) : per_image;
    return {t.data<float>() + image * per_image, 0, plane};
  }

  // One run while measuring, as tiles or whole, `seconds` long; the choice once each way has
  // kMeasuredRuns after its first.
  void record_measured_run(bool whole, double seconds) {
    if (++measured_runs_ <= 2) return;
    (whole ? whole_seconds_ : tile_seconds_).push_back(seconds);
    if (whole_seconds_.size() < kMeasuredRuns) return;
    const double tiles = median(tile_seconds_), wholes = median(whole_seconds_);
    columns_mode_ = wholes < tiles ? Columns::kWhole : Columns::kTiles;
    if (columns_mode_ == Columns::kWhole) placed_ = std::move(whole_placed_);
    whole_placed_ = Placement{};
    // The way not taken never runs again: its packed weights go.
    for (ColumnRun& run : columns_) {
      if (columns_mode_ == Columns::kWhole) {
        run.kernels.clear();
      } else {
        run.whole.clear();
      }
    }
    if (options_.verbose || verbose_from_env()) {
      std::fprintf(stderr,
                   "depthwise: a run with the columns as tiles %.0f us, with their ops whole "
                   "%.0f us (medians of %zu runs each): %s\n",
                   tiles * 1e6, wholes * 1e6, kMeasuredRuns,
                   columns_mode_ == Columns::kWhole ? "ops whole" : "tiles");
    }
  }

  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
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
  std::vector<ColumnRun> columns_;   // per plan column
  std::vector<Unit> units_;          // in graph order
  Placement placed_;
  // How the columns run; while measuring, the runs so far, their times each way, and the
  // placement for the runs with the columns' ops whole (placed_ is then the one for tiles).
  Columns columns_mode_ = Columns::kTiles;
  int measured_runs_ = 0;
  std::vector<double> tile_seconds_, whole_seconds_;
  Placement whole_placed_;
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
  return plan_text(graph, plan::plan_columns(graph, plan_options(threads, options)), options);
}

}  // namespace sparsecol::runtime
