#include "plan/tile_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "f32-conv/conv.h"
#include "f32-spmm/spmm.h"
#include "graph/op_params.h"
#include "plan/memory_plan.h"
#include "runtime/kernel_bindings.h"

namespace sparsecol::plan {

namespace {

using Dims = std::vector<int64_t>;

// The convolution kernels work on chunks of output rows whose scratch stays near
// kernels::kIm2colBudgetFloats (the sparse path's padded rows and outputs too): the scratch does
// not grow with the tile's height beyond that (but for very deep layers, see conv.h).
constexpr int64_t kScratchChunkBytes = kernels::kIm2colBudgetFloats * int64_t{sizeof(float)};
constexpr int64_t kMinTilePixels = 64;
// A linear layer's sparse kernel works on blocks of this many tokens (f32-spmm/spmm.h), and the
// dense GEMM re-reads its whole weight per tile: fewer tokens per tile waste both.
constexpr int64_t kMinTileTokens = kernels::kSpmmTokenBlock;
constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();

const graph::Value& value_of(const graph::Graph& graph, int id) {
  return graph.values[static_cast<std::size_t>(id)];
}

std::optional<Dims> dims_of(const graph::Graph& graph, int id) {
  if (id < 0) return std::nullopt;
  const graph::Value& v = value_of(graph, id);
  if (!v.shape || !v.dtype_known) return std::nullopt;
  return graph::concrete(*v.shape);
}

bool is_f32(const graph::Graph& graph, int id) {
  return id >= 0 && value_of(graph, id).dtype == DType::kFloat32;
}

bool is_constant(const graph::Graph& graph, int id) {
  return id >= 0 && value_of(graph, id).constant.has_value();
}

int64_t numel(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t bytes_of(const graph::Graph& graph, int id) {
  const std::optional<Dims> d = dims_of(graph, id);
  return d ? numel(*d) * static_cast<int64_t>(dtype_size(value_of(graph, id).dtype)) : 0;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Reshape & co. move no bytes (the executors run them as views).
bool is_view(const graph::Node& node) { return graph::keeps_element_order(node); }

// How an operand of an element-wise op (or of a fused Add) on a tile of the output `out` is
// read: row by row (same shape), not at all (a constant scalar, or a constant vector per channel
// of an NCHW image or per feature of a token sequence), or not in a form the tile kernels take.
std::optional<RowMap> operand_map(const graph::Graph& graph, int operand, const Dims& out,
                                  bool tokens) {
  const std::optional<Dims> d = dims_of(graph, operand);
  if (!d || !is_f32(graph, operand)) return std::nullopt;
  if (is_constant(graph, operand)) {
    const int64_t n = numel(*d);
    if (n == 1) return RowMap{};  // a scalar, of any rank
    const bool along_axis =
        !d->empty() && graph::broadcasts_to(*d, out) &&
        (tokens ? n == out.back() && d->back() == n
                : n == out[1] && d->size() >= 3 && (*d)[d->size() - 3] == out[1]);
    if (along_axis) return RowMap{};
    return std::nullopt;
  }
  if (*d == out) return RowMap{RowMap::Kind::kSame};
  return std::nullopt;
}

// Whether constant weight `w` runs through the sparse kernels: the same choice as the kernels'
// own packing (kernels::PackedConv, the layer-by-layer linear steps).
bool runs_sparse(const graph::Graph& graph, int w, double sparse_threshold,
                 kernels::SparseLayerKind kind) {
  const Tensor& weight = *value_of(graph, w).constant;
  return kernels::zero_fraction(weight.data<float>(), weight.numel()) >=
         kernels::resolve_sparse_threshold(sparse_threshold, kind);
}

// The exact non-zeros of constant weight `w`.
int64_t nonzeros(const graph::Graph& graph, int w) {
  const Tensor& weight = *value_of(graph, w).constant;
  const float* data = weight.data<float>();
  return weight.numel() - std::count(data, data + weight.numel(), 0.0f);
}

// The packed bytes of sparse weight `w` (kernels::SparseMatrix::packed_bytes): a value and an
// offset per non-zero, and `row_pointers` row pointers.
int64_t sparse_bytes(const graph::Graph& graph, int w, int64_t row_pointers) {
  return nonzeros(graph, w) * 8 + row_pointers * 4;
}

// `dense_flops` scaled by the fraction of non-zeros of weight `w` (a multiple of its element
// count: each element is one multiply-add per output pixel or token).
int64_t scale_by_density(const graph::Graph& graph, int w, int64_t dense_flops) {
  const int64_t count = value_of(graph, w).constant->numel();
  return count == 0 ? 0 : dense_flops / count * nonzeros(graph, w);
}

RowMap window_map(const graph::WindowParams& w) {
  return RowMap{RowMap::Kind::kWindow, w.kernel[0],     w.strides[0],
                w.dilations[0],        w.pads_begin[0], w.in_size[0]};
}

bool is_unary(const std::string& op) {
  static const char* const kUnary[] = {"Relu", "Clip", "Sigmoid", "Tanh",
                                       "Erf",  "Exp",  "Sqrt",    "Neg"};
  return std::any_of(std::begin(kUnary), std::end(kUnary), [&](const char* u) { return op == u; });
}

bool is_binary(const std::string& op) {
  return op == "Add" || op == "Sub" || op == "Mul" || op == "Div";
}

// What layout_column needs of the graph beyond the ops, computed once per plan.
struct GraphFacts {
  std::vector<std::vector<int>> consumers;  // value -> nodes
  std::vector<bool> is_graph_output;        // per value
};

GraphFacts graph_facts(const graph::Graph& graph) {
  GraphFacts facts{graph.consumers(), std::vector<bool>(graph.values.size(), false)};
  for (int v : graph.outputs) facts.is_graph_output[static_cast<std::size_t>(v)] = true;
  return facts;
}

bool is_sparse_linear(const graph::Graph& graph, const TileOp& op) {
  return op.sparse && graph.nodes[static_cast<std::size_t>(op.node)].op_type == "MatMul";
}

// Whether `first`'s output can pass to `second` in the sparse linear kernel's feature blocks:
// both sparse linear layers, `second` the output's one reader (as its X, once), and `first`'s
// epilogue finished by its kernel while the block is feature-major (no residual, which is read
// token-major, and nothing after it). BERT's FFN: the up projection with its GELU, then the down
// projection. The layer-by-layer steps pass such a value so too (runtime::layerwise).
bool passes_in_feature_blocks(const graph::Graph& graph, const GraphFacts& facts,
                              const TileOp& first, const TileOp& second) {
  if (!is_sparse_linear(graph, first) || !is_sparse_linear(graph, second)) return false;
  const auto v = static_cast<std::size_t>(first.output);
  const std::vector<int>& in = graph.nodes[static_cast<std::size_t>(second.node)].inputs;
  if (facts.is_graph_output[v] || facts.consumers[v].size() != 1 || in[0] != first.output ||
      std::count(in.begin(), in.end(), first.output) != 1) {
    return false;
  }
  const std::optional<runtime::FusedEpilogue> fused = fuse_tile_epilogue(graph, first);
  return fused && fused->residual_input < 0 &&
         fused->kernel.post_residual == kernels::Activation::kNone;
}

// Column::feature_blocks, from the column's tiles (c.tile_rows set).
void mark_feature_blocks(const graph::Graph& graph, const GraphFacts& facts,
                         const std::vector<TileOp>& ops, Column& c) {
  const std::size_t m = ops.size();
  c.feature_blocks.assign(m, false);
  const TileOp& anchor = ops.back();
  const int64_t block = kernels::kSpmmTokenBlock;
  if (!anchor.tokens || c.tile_rows % block != 0 || anchor.rows % block != 0) return;
  for (std::size_t i = 0; i + 1 < m; ++i) {
    for (std::size_t j = i + 1; j < m; ++j) {
      if (passes_in_feature_blocks(graph, facts, ops[i], ops[j])) c.feature_blocks[i] = true;
    }
  }
}

// The op of a column that writes value v, or -1.
int producer_in(const std::vector<TileOp>& ops, int v) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].output == v) return static_cast<int>(i);
  }
  return -1;
}

// `even_rows`: the anchor's rows are split into as many tiles as tiles of `tile_rows` make, of
// heights that differ by one at most (c.tile_rows: the tallest), instead of tiles of `tile_rows`
// and a short last one. The threads take contiguous runs of tiles (TileQueue), so at batch 1 a
// short last tile left its thread with less work than the others: ResNet-50 90% on 2 threads,
// its first column's 56 rows in tiles of 6 (9 x 6 + 2), had its busier thread's time at 1.064x
// the threads' mean (median of 10 traced runs), 1.031x in tiles of 5 and 6 (the thread that
// starts mid-image still computes its first tile's halo afresh); end to end within the noise
// (Intel Xeon VM, docs/BENCHMARKS.md, the forty-sixth session).
std::optional<Column> layout(const graph::Graph& graph, const GraphFacts& facts,
                             std::vector<TileOp> ops, int64_t tile_rows, bool rolling,
                             bool even_rows = false) {
  if (ops.empty()) return std::nullopt;
  const auto m = static_cast<int>(ops.size());
  const int first_node = ops.front().node, last_node = ops.back().node;
  auto producer = [&](int v) { return producer_in(ops, v); };
  // source[i][j]: the op of this column that writes input j of op i, or -1.
  std::vector<std::vector<int>> source(static_cast<std::size_t>(m));
  for (int i = 0; i < m; ++i) {
    const graph::Node& node =
        graph.nodes[static_cast<std::size_t>(ops[static_cast<std::size_t>(i)].node)];
    for (int v : node.inputs)
      source[static_cast<std::size_t>(i)].push_back(v >= 0 ? producer(v) : -1);
  }
  Column c;
  c.batch = ops.front().batch;
  std::vector<int> last_reader(static_cast<std::size_t>(m), -1);  // within the column
  std::vector<bool> escapes(static_cast<std::size_t>(m), false);
  for (int i = 0; i < m; ++i) {
    const TileOp& op = ops[static_cast<std::size_t>(i)];
    if (op.batch != c.batch) return std::nullopt;
    const graph::Node& node = graph.nodes[static_cast<std::size_t>(op.node)];
    for (int v : node.inputs) {
      if (v < 0 || is_constant(graph, v)) continue;
      const int k = producer(v);
      if (k >= 0) {
        last_reader[static_cast<std::size_t>(k)] = i;
      } else if (std::find(c.inputs.begin(), c.inputs.end(), v) == c.inputs.end()) {
        c.inputs.push_back(v);
      }
    }
    const auto v = static_cast<std::size_t>(op.output);
    escapes[static_cast<std::size_t>(i)] =
        i == m - 1 || facts.is_graph_output[v] ||
        std::any_of(facts.consumers[v].begin(), facts.consumers[v].end(),
                    [&](int reader) { return reader < first_node || reader > last_node; });
  }
  // Every intermediate must be read inside the column: its rows per tile follow from its
  // readers' (an unread one would fall wholly to the last tile).
  for (int i = 0; i + 1 < m; ++i) {
    if (last_reader[static_cast<std::size_t>(i)] < 0) return std::nullopt;
  }

  const int64_t height = ops.back().rows;
  c.tile_rows = std::clamp<int64_t>(tile_rows, 1, height);
  c.tiles_per_image = ceil_div(height, c.tile_rows);
  // Tile t's anchor rows start here (with t = tiles_per_image: the end). Evened out, the tallest
  // tile is no taller than tile_rows, and as many tiles of its height make the same count.
  auto anchor_start = [&](int64_t t) {
    return even_rows ? t * height / c.tiles_per_image : std::min(height, t * c.tile_rows);
  };
  if (even_rows) c.tile_rows = ceil_div(height, c.tiles_per_image);
  const auto tiles = static_cast<std::size_t>(c.tiles_per_image);

  // Rows each op computes for tile t: the anchor's row block, then backwards through the
  // column, each op's input rows from the tile algebra; `own` (when given) adds the rows an
  // output op writes to memory.
  auto propagate = [&](std::size_t t, const std::vector<std::vector<RowRange>>* own) {
    std::vector<RowRange> need(static_cast<std::size_t>(m));
    const auto tile = static_cast<int64_t>(t);
    need.back() = {anchor_start(tile), anchor_start(tile + 1)};
    for (int i = m - 1; i >= 0; --i) {
      const TileOp& op = ops[static_cast<std::size_t>(i)];
      if (own != nullptr) {
        need[static_cast<std::size_t>(i)] =
            hull(need[static_cast<std::size_t>(i)], (*own)[t][static_cast<std::size_t>(i)]);
      }
      const std::vector<int>& from = source[static_cast<std::size_t>(i)];
      for (std::size_t j = 0; j < from.size(); ++j) {
        const int k = from[j];
        if (k < 0) continue;
        need[static_cast<std::size_t>(k)] =
            hull(need[static_cast<std::size_t>(k)],
                 op.inputs[j].input_rows(need[static_cast<std::size_t>(i)]));
      }
    }
    return need;
  };
  std::vector<std::vector<RowRange>> base(tiles);
  for (std::size_t t = 0; t < tiles; ++t) base[t] = propagate(t, nullptr);
  // An output op's own rows: from where tile t's readers start to where tile t+1's start, so
  // that the tiles' own rows partition the tensor (starts are monotone in t).
  c.own.assign(tiles, std::vector<RowRange>(static_cast<std::size_t>(m)));
  for (int i = 0; i < m; ++i) {
    if (!escapes[static_cast<std::size_t>(i)]) continue;
    std::vector<int64_t> start(tiles + 1, 0);
    for (std::size_t t = 1; t < tiles; ++t) {
      const RowRange r = base[t][static_cast<std::size_t>(i)];
      start[t] = std::max(start[t - 1], r.empty() ? start[t - 1] : r.begin);
    }
    start[tiles] = ops[static_cast<std::size_t>(i)].rows;
    for (std::size_t t = 0; t < tiles; ++t) {
      c.own[t][static_cast<std::size_t>(i)] = {start[t], std::max(start[t], start[t + 1])};
    }
  }
  c.rows.resize(tiles);
  for (std::size_t t = 0; t < tiles; ++t) c.rows[t] = propagate(t, &c.own);

  // Tile buffers (all but the anchor's) in one per-thread arena, planned like the layer-by-layer
  // arena with the column's op index as the step; plus the largest kernel scratch.
  std::vector<BufferRequest> requests;
  int64_t useful = 0, computed = 0;
  for (int i = 0; i < m; ++i) {
    const TileOp& op = ops[static_cast<std::size_t>(i)];
    int64_t max_rows = 0;
    bool kept = false;  // rows kept for the next tile: the buffer outlives the tile
    for (std::size_t t = 0; t < tiles; ++t) {
      const int64_t r = c.rows[t][static_cast<std::size_t>(i)].size();
      max_rows = std::max(max_rows, r);
      computed += r * op.channels * op.width;
      kept = kept || (rolling && t > 0 &&
                      !kept_rows(c.rows[t - 1][static_cast<std::size_t>(i)],
                                 c.rows[t][static_cast<std::size_t>(i)])
                           .empty());
    }
    useful += op.rows * op.channels * op.width;
    c.flops += op.batch * op.rows * op.flops_per_row;
    c.scratch_bytes = std::max(c.scratch_bytes,
                               std::min(op.scratch_cap_bytes, op.scratch_bytes_per_row * max_rows));
    c.weight_bytes += op.weight_bytes;
    const int64_t tensor_bytes = op.batch * op.rows * op.row_bytes();
    (escapes[static_cast<std::size_t>(i)] ? c.bytes_to_memory : c.bytes_in_cache) += tensor_bytes;
    if (escapes[static_cast<std::size_t>(i)]) c.outputs.push_back(op.output);
    if (i + 1 < m) {
      requests.push_back(
          {op.channels * op.plane_floats(max_rows) * 4, kept ? 0 : i, kept ? m : last_reader[i]});
    }
  }
  std::rotate(c.outputs.rbegin(), c.outputs.rbegin() + 1, c.outputs.rend());  // anchor first
  mark_feature_blocks(graph, facts, ops, c);
  const MemoryPlan arena = plan_memory(requests);
  c.arena_bytes = arena.arena_size;
  c.buffer_offset = arena.offsets;
  c.buffer_offset.push_back(-1);
  c.buffer_requests = std::move(requests);
  c.written_over.assign(static_cast<std::size_t>(m), -1);
  c.working_set_bytes = c.arena_bytes + c.scratch_bytes + c.weight_bytes;  // all resident
  c.halo_overhead = useful > 0 ? static_cast<double>(computed - useful) / useful : 0.0;
  c.ops = std::move(ops);
  return c;
}

// The budget of a tier per core.
int64_t tier_budget(Tier tier, const PlanOptions& options) {
  if (tier == Tier::kL2) return options.cache_budget_bytes;
  return static_cast<int64_t>(options.shared_cache_fraction *
                              static_cast<double>(options.shared_cache_bytes) /
                              std::max(1, options.threads));
}

// L2: the weights stay in L2 beside the tile buffers when all fit. Otherwise they are streamed
// from the shared L3 on every tile (all threads read the same ones), which still keeps the
// intermediates in L2 as long as the weights fit half the shared cache; with tiles of at least
// kMinTilePixels pixels each weight read from L3 feeds 64+ FMAs, far above what L3 bandwidth
// limits (~30 GB/s per core on current x86: ~500 GFMA/s at 64 FMAs per 4-byte weight).
// L3: everything lives in the shared cache, the weights once for all threads.
void size_working_set(Column& c, Tier tier, const PlanOptions& options) {
  const int64_t activations = c.arena_bytes + c.scratch_bytes;
  c.tier = tier;
  c.budget_bytes = tier_budget(tier, options);
  if (tier == Tier::kL3) {
    c.weights_streamed = false;
    c.working_set_bytes = activations + c.weight_bytes / std::max(1, options.threads);
    return;
  }
  c.weights_streamed = activations + c.weight_bytes > options.cache_budget_bytes;
  c.working_set_bytes = activations + (c.weights_streamed ? 0 : c.weight_bytes);
}

bool fits(const Column& c, const PlanOptions& options) {
  const bool weights_fit = !c.weights_streamed || c.weight_bytes <= options.shared_cache_bytes / 2;
  return weights_fit && c.working_set_bytes <= c.budget_bytes;
}

// A GEMM on fewer pixels than its kernel's tile wastes most of its time on edges (the conv
// kernel's own minimum chunk is 64 pixels, kernels/f32-conv; the sparse kernels hold 64 pixels
// of a row in registers), and every tile streams the column's weights again. Likewise tokens.
int64_t min_tile_rows(const TileOp& anchor) {
  return anchor.tokens ? kMinTileTokens : ceil_div(kMinTilePixels, anchor.width);
}

// At a batch of several images, a column of dense convolutions that all stack their images
// (TileOp::stacks_images: small planes) is not formed: layer by layer, each stacks whole images
// into one product, which pays more than keeping such small intermediates in cache. Where
// another op joins them (a depthwise convolution, memory-bound) or their weights are sparse
// (more memory-bound), the column pays more. ResNet-50 at batch 16, 2 threads, depth-wise /
// layer by layer with and without the rule: dense 1.02-1.04x -> 1.08x; MobileNetV2 with its 7x7
// stage's columns (expand, depthwise, project) all whole 1.11x -> 1.07x, 80% pruned 1.97x ->
// 1.79x (a slow spell); ResNet-50 90% pruned with its 7x7 stage whole 1.28x -> 1.25x
// (docs/BENCHMARKS.md, the seventeenth session).
bool stacks_whole_images(const std::vector<TileOp>& ops, const PlanOptions& options) {
  return options.tile_rows == 0 && std::all_of(ops.begin(), ops.end(), [](const TileOp& op) {
           return op.batch > 1 && op.stacks_images && !op.sparse;
         });
}

// The tallest tile of an anchor that still gives every thread tiles at a small batch: two per
// thread for balance, or one where two would be narrower than a kernel tile; nullopt where even
// one per thread would be (small planes at batch 1: ResNet-50's 7x7 stage). Those ops run whole
// instead, each split across the threads by the layer-by-layer steps: with 14-pixel tiles
// ResNet-50 90% pruned ran 0.95x and MobileNetV2 80% 0.87x layer by layer at batch 1 (2
// threads), with this rule 1.00x and 1.20x (docs/BENCHMARKS.md). A batch with enough images is
// tiled for the cache alone; a forced tile height (PlanOptions::tile_rows) is the user's call.
std::optional<int64_t> max_tile_rows(const TileOp& anchor, const PlanOptions& options) {
  const auto threads = static_cast<int64_t>(std::max(1, options.threads));
  for (const int64_t per_thread : {2, 1}) {
    const int64_t tiles =
        std::min(anchor.rows, ceil_div(per_thread * threads, std::max<int64_t>(1, anchor.batch)));
    const int64_t cap = ceil_div(anchor.rows, std::max<int64_t>(1, tiles));
    if (tiles == 1 || cap >= min_tile_rows(anchor) || options.tile_rows > 0) return cap;
  }
  return std::nullopt;
}

// The column of `ops` in tier `tier` at the tallest tile that fits the tier's budget, or
// nullopt when it is no valid column, fits at no height, recomputes too much, or would need
// tiles narrower than a kernel tile.
std::optional<Column> choose_tile(const graph::Graph& graph, const GraphFacts& facts,
                                  const std::vector<TileOp>& ops, Tier tier,
                                  const PlanOptions& options, bool* valid) {
  const std::optional<int64_t> max_rows = max_tile_rows(ops.back(), options);
  if (!max_rows || stacks_whole_images(ops, options)) {
    *valid = false;  // a longer column may end on a larger plane
    return std::nullopt;
  }
  const int64_t cap = *max_rows;
  const int64_t min_rows = std::min(cap, min_tile_rows(ops.back()));
  auto layout_at = [&](int64_t rows) {
    std::optional<Column> c =
        layout(graph, facts, ops, rows, options.rolling, /*even_rows=*/!ops.back().tokens);
    if (c) size_working_set(*c, tier, options);
    return c;
  };
  std::optional<Column> best = layout_at(min_rows);
  *valid = best.has_value();
  if (!best || !fits(*best, options)) return std::nullopt;
  // The working set grows with the tile height: binary search for the tallest that fits. Except
  // that rolling buffers keep rows only where an image has several tiles: a whole-image tile
  // (the tallest at a batch with an image per thread) may fit where shorter ones do not.
  int64_t lo = min_rows, hi = cap;
  if (std::optional<Column> whole = cap > min_rows ? layout_at(cap) : std::nullopt;
      whole && fits(*whole, options)) {
    lo = cap;
    best = std::move(whole);
  }
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    std::optional<Column> c = layout_at(mid);
    if (c && fits(*c, options)) {
      lo = mid;
      best = std::move(c);
    } else {
      hi = mid - 1;
    }
  }
  // Token tiles in whole blocks of the sparse kernel (kSpmmTokenBlock): 85 tokens would run a
  // block of 64 and one of 21.
  if (ops.back().tokens && lo < cap && lo > kMinTileTokens)
    lo = lo / kMinTileTokens * kMinTileTokens;
  if (best->tiles_per_image != ceil_div(ops.back().rows, lo)) best = layout_at(lo);
  if (ops.size() > 1 && best->halo_overhead > options.max_halo_overhead) return std::nullopt;
  // A few tiles the threads cannot share evenly leave one idle for a whole tile, and every tile
  // streams the column's weights again: there the ops run whole, each split across the threads
  // by the layer-by-layer steps. ResNet-50 at batch 1 on 2 threads tiled its 14x14 stage in 3
  // tiles of 5 rows (3.3 MiB of weights each) and ran depth-wise 0.90x of layer by layer.
  const int64_t threads = std::max(1, options.threads);
  const int64_t tiles = ops.back().batch * ceil_div(ops.back().rows, lo);
  if (options.tile_rows == 0 && tiles < 4 * threads && tiles % threads != 0) return std::nullopt;
  return best;
}

// The columns from ops[0] on in one tier, longest last: any, and those with one output only (they
// end where a block ends: nothing but their last value is read after them).
struct Candidates {
  std::optional<Column> best;
  std::vector<Column> singles;
  bool done = false;  // a valid column did not fit: a longer one fits even less
  void consider(std::optional<Column> c, bool valid) {
    if (!c) {
      done = valid;
      return;
    }
    if (c->outputs.size() == 1) singles.push_back(*c);
    best = std::move(c);
  }
  // The longest, unless the longest single-output one is not much shorter (at least half as
  // long): then the extra output costs more than the extra column (but one op alone is no column,
  // see plan_columns). And a single-output column whose last op widens what it writes (an
  // inverted residual block's expansion) ends before that op where that is a block's end too:
  // the narrow value goes to memory, and the expansion starts the next column, which keeps its
  // output in cache. MobileNetV2's columns grew past a block's 24- or 32-channel projection into
  // the next block's 144- or 192-channel expansion: at batch 16 its first (L3) column wrote 9.2
  // MiB per run, not 1.5, and the next column read them back.
  std::optional<Column> pick() const {
    auto long_enough = [&](const Column& c) {
      return c.ops.size() > 1 && 2 * c.ops.size() >= best->ops.size();
    };
    if (singles.empty() || !long_enough(singles.back())) return best;
    std::size_t k = singles.size() - 1;
    while (k > 0 && singles[k - 1].ops.size() + 1 == singles[k].ops.size() &&
           long_enough(singles[k - 1]) &&
           singles[k - 1].bytes_to_memory < singles[k].bytes_to_memory) {
      --k;
    }
    return singles[k];
  }
};

// Where layer by layer keeps its activations in the L3 (no L3 tier), an L2 column only saves
// their round trips between L2 and L3, and its tiles cost: halos recomputed, shorter kernel
// calls, and the column's inputs and outputs read and written in row pieces (the output into
// lines not in cache, where layer by layer writes a block's last op over its residual). So it
// pays only where it keeps much and computes little per byte kept. Two limits, each measured.
//
// FLOPs per byte kept: memory-bound ops (sparse and depthwise convolutions, 5-54 FLOPs per byte
// kept in ResNet-50 90-95% and MobileNetV2) gain, dense ones (ResNet-50's dense blocks 74-544,
// BERT's 384) do not. Dense ResNet-50 at batch 1 (2 threads, fast mode, 3 alternated runs each):
// depth-wise / layer by layer 0.977-0.981x with its L2 columns, 0.992-0.997x without those above
// 100 FLOPs per byte, 1.001-1.007x without those above 60; ResNet-50 90% 0.995-0.997x with all,
// 0.997-1.003x without those above 100 (1.08x in a slow-mode spell, where its 14x14 columns
// lost); BERT dense 1.007-1.010x with its columns (a linear layer and its layer norm), 0.998-1.006x
// without.
constexpr double kMaxColumnFlopsPerCachedByte = 64.0;
// Bytes kept per byte written, for image columns: a bottleneck block (ResNet-50's 1x1 layers cut
// the channels 4x) keeps less than it writes, an inverted residual block (MobileNetV2's expand
// 6x) 2-33x more. ResNet-50 90% at batch 1, 2 threads, Zen 4, 3 alternated runs of each: with
// every column 0.967-0.986x of layer by layer, with the two of its nine columns that keep 2.3x
// and 4x 1.005-1.038x; 95% 0.954-0.972x -> 0.976-1.010x; MobileNetV2 80% keeps all eight of its
// columns (1.08-1.12x), and with a limit of 3, which drops two of them, ran 1.04-1.06x. Token
// columns (BERT 90%: a linear layer and its layer norm, 1x) have no halo: not limited.
constexpr double kMinImageColumnBytesKeptPerByteWritten = 2.0;

// The bytes of an op's whole output at the plan's batch: what layer by layer writes.
int64_t activation_bytes(const TileOp& op) { return op.batch * op.rows * op.row_bytes(); }

// Why an L2 column does not pay where layer by layer keeps its activations in the L3, or "" where
// it does (see above).
std::string why_l2_column_does_not_pay(const Column& c) {
  if (c.flops_per_cached_byte() > kMaxColumnFlopsPerCachedByte) {
    return fmt::format(
        "its column would do {:.0f} FLOPs per byte it keeps in L2, while layer by layer keeps "
        "that byte in the L3 anyway: compute-bound, tiles would only cost",
        c.flops_per_cached_byte());
  }
  const double kept_per_written = static_cast<double>(c.bytes_in_cache) /
                                  static_cast<double>(std::max<int64_t>(1, c.bytes_to_memory));
  if (!c.ops.back().tokens && kept_per_written < kMinImageColumnBytesKeptPerByteWritten) {
    return fmt::format(
        "its column would keep {:.1f} bytes in L2 per byte it writes, while layer by layer keeps "
        "its activations in the L3 anyway: too little saved for what its tiles cost",
        kept_per_written);
  }
  return "";
}

std::string kib(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  return fmt::format("{:.1f} KiB", bytes / 1024.0);
}

// Why a tileable op runs whole, `best` being the column from it the planner found, if any.
std::string whole_reason(const TileOp& op, const std::optional<Column>& best,
                         const PlanOptions& options) {
  if (stacks_whole_images({op}, options)) {
    return fmt::format("at batch {}, layer by layer stacks its whole {}x{} images", op.batch,
                       op.rows, op.width);
  }
  if (best && best->ops.size() > 1) {
    return "its column would keep nothing in cache (every value it computes is read after it)";
  }
  if (best) {
    return "one op alone keeps nothing in cache, and no longer column from here fits the budget "
           "(or the next op cannot join it)";
  }
  if (!max_tile_rows(op, options)) {
    return fmt::format("{} threads at batch {} would need tiles under {}", options.threads,
                       op.batch,
                       op.tokens ? fmt::format("{} tokens", kMinTileTokens)
                                 : fmt::format("{} pixels", kMinTilePixels));
  }
  return fmt::format("its working set exceeds the cache budget even alone ({} of weights)",
                     kib(op.weight_bytes));
}

std::string op_label(const graph::Node& node) {
  std::string label = node.op_type;
  for (const graph::EpilogueOp& e : node.epilogue) label += std::string("+") + to_string(e.kind);
  return label;
}

}  // namespace

const char* to_string(Tier tier) { return tier == Tier::kL2 ? "L2" : "L3"; }

RowRange hull(RowRange a, RowRange b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return {std::min(a.begin, b.begin), std::max(a.end, b.end)};
}

RowRange RowMap::input_rows(RowRange out) const {
  if (out.empty() || kind == Kind::kNone) return {};
  if (kind == Kind::kSame) return out;
  const int64_t lo = out.begin * stride - pad_top;
  const int64_t hi = (out.end - 1) * stride - pad_top + (kernel - 1) * dilation + 1;
  const int64_t first = std::clamp<int64_t>(lo, 0, in_rows);
  return {first, std::clamp<int64_t>(hi, first, in_rows)};
}

RowRange kept_rows(RowRange previous, RowRange current) {
  if (previous.empty() || current.empty() || current.begin < previous.begin ||
      current.end < previous.end) {
    return {};
  }
  return {current.begin, std::min(previous.end, current.end)};
}

bool Column::is_output(int op) const {
  return std::find(outputs.begin(), outputs.end(), ops[static_cast<std::size_t>(op)].output) !=
         outputs.end();
}

double Column::flops_per_cached_byte() const {
  return static_cast<double>(flops) / static_cast<double>(std::max<int64_t>(1, bytes_in_cache));
}

std::optional<TileOp> make_tile_op(const graph::Graph& graph, int node_index, std::string* why_not,
                                   double sparse_threshold) {
  const graph::Node& node = graph.nodes[static_cast<std::size_t>(node_index)];
  auto refuse = [&](const char* why) -> std::optional<TileOp> {
    *why_not = why;
    return std::nullopt;
  };
  if (!node.domain.empty()) return refuse("not the default domain");
  if (node.outputs.empty() || node.outputs[0] < 0) return refuse("no output");
  for (std::size_t i = 1; i < node.outputs.size(); ++i) {
    if (node.outputs[i] >= 0) return refuse("a second output");
  }
  const std::optional<Dims> y = dims_of(graph, node.outputs[0]);
  if (!y || y->size() < 2 || y->size() > 4 || !is_f32(graph, node.outputs[0])) {
    return refuse("the output is neither a float32 NCHW image nor a token sequence");
  }
  TileOp op;
  op.node = node_index;
  op.output = node.outputs[0];
  op.tokens = y->size() < 4;
  op.batch = y->size() == 2 ? 1 : (*y)[0];
  op.channels = op.tokens ? 1 : (*y)[1];
  op.rows = (*y)[y->size() - 2];
  op.width = y->back();
  op.inputs.assign(node.inputs.size(), RowMap{});
  op.scratch_cap_bytes = kNoCap;
  // Input 0 holds the same images, or the same tokens of the same sequences.
  const std::optional<Dims> x = dims_of(graph, node.input(0));
  if (!x || x->size() != y->size() || !is_f32(graph, node.input(0)) ||
      (op.tokens ? !std::equal(y->begin(), y->end() - 1, x->begin()) : (*x)[0] != op.batch)) {
    return refuse(op.tokens ? "input 0 is not a float32 sequence of the output's tokens"
                            : "input 0 is not a float32 NCHW tensor of the output's batch");
  }
  if (node.op_type == "Conv" && !op.tokens) {
    const int w = node.input(1), b = node.input(2);
    if (!is_constant(graph, w) || !is_f32(graph, w) ||
        (b >= 0 && (!is_constant(graph, b) || !is_f32(graph, b)))) {
      return refuse("weights or bias are not float32 constants");
    }
    const Dims w_dims = *dims_of(graph, w);
    const graph::ConvParams p = graph::parse_conv(
        graph, node, *x, w_dims, b >= 0 ? dims_of(graph, b) : std::optional<Dims>{});
    op.inputs[0] = window_map(p.window);
    const int64_t bias_bytes = b >= 0 ? bytes_of(graph, b) : 0;
    op.weight_bytes = bytes_of(graph, w) + bias_bytes;
    const bool depthwise = p.group == p.in_channels && p.group == p.out_channels;
    const bool pointwise = numel(p.window.kernel) == 1 && numel(p.window.strides) == 1 &&
                           p.window.pads_begin[0] == 0 && p.window.pads_begin[1] == 0;
    // The same choice as kernels::PackedConv (f32-conv/conv.cc): depth-wise convolutions stay
    // dense, any other runs sparse from the threshold on.
    op.sparse =
        !depthwise && runs_sparse(graph, w, sparse_threshold, kernels::SparseLayerKind::kConv);
    op.stacks_images = kernels::stacks_images(runtime::conv_geometry(p), op.sparse);
    const int64_t taps = numel(p.window.kernel);
    op.flops_per_row = 2 * op.channels * op.width * (p.in_channels / p.group) * taps;
    if (op.sparse) {
      op.flops_per_row = scale_by_density(graph, w, op.flops_per_row);
      // ResNet-50 s90's layer3 streams 0.9 MiB per block instead of 4.3.
      op.weight_bytes = sparse_bytes(graph, w, p.out_channels + 1) + bias_bytes;
    }
    if (depthwise) {
      // One channel's padded input rows at a time (kernels/f32-dwconv).
      op.scratch_bytes_per_row = p.window.strides[0] * (p.window.in_size[1] + 2 * 8) * 4;
    } else if (kernels::gathers_strided_pointwise(runtime::conv_geometry(p))) {
      // The gathered input pixels of the rows (f32-conv/conv.h), dense or sparse, no chunks.
      op.scratch_bytes_per_row = p.in_channels * op.width * 4;
    } else if (!pointwise &&
               (op.sparse || kernels::runs_on_phase_planes(runtime::conv_geometry(p)))) {
      // No im2col: a zero-padded copy of the chunk's input rows split by stride phase, and the
      // chunk's output rows (phase_w wide) before the epilogue copies them out (conv.cc).
      const int64_t phase_w =
          op.width + (p.window.kernel[1] - 1) * p.window.dilations[1] / p.window.strides[1];
      op.scratch_bytes_per_row =
          (p.in_channels * numel(p.window.strides) + p.out_channels) * phase_w * 4;
      op.scratch_cap_bytes = kScratchChunkBytes;
    } else if (!pointwise) {
      // im2col: the group's input channels x taps for every output pixel of the row, in
      // chunks of kernels::im2col_chunk_rows (about kIm2colBudgetFloats; a deep layer's chunk
      // is larger: ResNet-50's 4608-deep 7-wide layer takes 7 rows, 884 KiB).
      op.scratch_bytes_per_row = p.in_channels / p.group * taps * op.width * 4;
      op.scratch_cap_bytes =
          op.scratch_bytes_per_row * kernels::im2col_chunk_rows(runtime::conv_geometry(p));
    }
  } else if ((node.op_type == "MaxPool" || node.op_type == "AveragePool") && !op.tokens) {
    const graph::PoolParams p = graph::parse_pool(graph, node, *x);
    op.inputs[0] = window_map(p.window);
    op.scratch_bytes_per_row = p.window.strides[0] * (p.window.in_size[1] + 2 * 8) * 4;
  } else if (node.op_type == "MatMul" && op.tokens) {
    // A linear layer: one constant [K, N] weight for every token. A MatMul of two activations
    // (attention's Q K^T and P V) reads every token of the other operand.
    const int w = node.input(1);
    const std::optional<Dims> w_dims = dims_of(graph, w);
    if (!is_constant(graph, w) || !is_f32(graph, w) || !w_dims || w_dims->size() != 2 ||
        (*w_dims)[0] != x->back()) {
      return refuse("needs the whole tensor (B is not a constant weight: every token reads all)");
    }
    op.inputs[0] = RowMap{RowMap::Kind::kSame};
    const int64_t k = (*w_dims)[0], n = (*w_dims)[1];
    op.sparse = runs_sparse(graph, w, sparse_threshold, kernels::SparseLayerKind::kLinear);
    op.flops_per_row = 2 * k * n;
    if (op.sparse) {
      op.flops_per_row = scale_by_density(graph, w, op.flops_per_row);
      // W^T in K blocks of kSpmmLinearDepthBlock rows, each with a row pointer per feature; the
      // kernel's scratch (a transposed block of tokens) does not grow with the tile.
      op.weight_bytes =
          sparse_bytes(graph, w, ceil_div(k, kernels::kSpmmLinearDepthBlock) * (n + 1));
      op.scratch_bytes_per_row = kernels::sparse_linear_scratch_floats(k) * 4;
      op.scratch_cap_bytes = op.scratch_bytes_per_row;
    } else {
      op.weight_bytes = bytes_of(graph, w);
      op.scratch_bytes_per_row = k * 4;  // the tile's tokens packed into the GEMM's panels
    }
  } else if ((node.op_type == "LayerNormalization" || node.op_type == "Softmax") && op.tokens) {
    // Each token on its own: normalized over its features only (the last axis).
    if (*x != *y) return refuse("input and output shapes differ");
    bool last_axis = false;
    if (node.op_type == "Softmax") {
      last_axis = graph::parse_softmax(graph, node, *x).inner == 1;
    } else {
      const int scale = node.input(1), bias = node.input(2);
      if (!is_constant(graph, scale) || !is_f32(graph, scale) ||
          (bias >= 0 && (!is_constant(graph, bias) || !is_f32(graph, bias)))) {
        return refuse("scale or bias is not a float32 constant");
      }
      const graph::LayerNormParams p =
          graph::parse_layer_norm(graph, node, *x, *dims_of(graph, scale),
                                  bias >= 0 ? dims_of(graph, bias) : std::optional<Dims>{});
      last_axis = p.inner == op.width && numel(*dims_of(graph, scale)) == op.width &&
                  (bias < 0 || numel(*dims_of(graph, bias)) == op.width);
    }
    if (!last_axis) return refuse("normalizes over more than one token's features");
    op.inputs[0] = RowMap{RowMap::Kind::kSame};
  } else if (is_unary(node.op_type)) {
    if (*x != *y) return refuse("input and output shapes differ");
    op.inputs[0] = RowMap{RowMap::Kind::kSame};
    for (std::size_t i = 1; i < node.own_input_count(); ++i) {  // Clip's bounds
      if (node.inputs[i] >= 0 && !is_constant(graph, node.inputs[i])) {
        return refuse("Clip bounds are not constants");
      }
    }
  } else if (is_binary(node.op_type)) {
    for (std::size_t i = 0; i < 2; ++i) {
      const std::optional<RowMap> map = operand_map(graph, node.input(i), *y, op.tokens);
      if (!map) return refuse("a broadcast the tile kernels do not take");
      op.inputs[i] = *map;
    }
    if (op.inputs[0].kind != RowMap::Kind::kSame) return refuse("input 0 is a broadcast constant");
  } else {
    return refuse("needs the whole tensor (no tile kernel for this op)");
  }
  for (const graph::EpilogueOp& e : node.epilogue) {
    if (e.kind != graph::EpilogueOp::Kind::kAdd) continue;
    const int operand = e.input >= 0 && static_cast<std::size_t>(e.input) < node.inputs.size()
                            ? node.inputs[e.input]
                            : -1;
    const std::optional<RowMap> map = operand_map(graph, operand, *y, op.tokens);
    if (!map) return refuse("a fused Add whose operand the tile kernels do not take");
    op.inputs[static_cast<std::size_t>(e.input)] = *map;
  }
  return op;
}

int share_residual_buffers(const graph::Graph& graph, Column& c,
                           const std::vector<bool>& may_overwrite) {
  const std::size_t m = c.ops.size();
  auto readers = [&](int v) {  // ops of the column reading v, counted once per input
    std::vector<std::size_t> ops;
    for (std::size_t j = 0; j < m; ++j) {
      for (int input : graph.nodes[static_cast<std::size_t>(c.ops[j].node)].inputs) {
        if (input == v) ops.push_back(j);
      }
    }
    return ops;
  };
  std::vector<BufferRequest>& requests = c.buffer_requests;
  const auto keeps_rows = [&](std::size_t k) {
    return requests[k].last_step == static_cast<int>(m);
  };
  int shared = 0;
  for (std::size_t i = 0; i + 1 < m; ++i) {  // the anchor writes to memory
    if (i >= may_overwrite.size() || !may_overwrite[i]) continue;
    const std::optional<runtime::FusedEpilogue> fused = fuse_tile_epilogue(graph, c.ops[i]);
    if (!fused || fused->residual_input < 0) continue;
    const int residual = graph.nodes[static_cast<std::size_t>(c.ops[i].node)]
                             .inputs[static_cast<std::size_t>(fused->residual_input)];
    const int k = producer_in(c.ops, residual);
    const std::vector<std::size_t> read_by = readers(residual);
    if (k < 0 || read_by.back() != i || keeps_rows(i)) continue;
    const auto ku = static_cast<std::size_t>(k);
    if (keeps_rows(ku) || std::count(read_by.begin(), read_by.end(), i) != 1 ||
        c.ops[ku].channels != c.ops[i].channels || c.ops[ku].width != c.ops[i].width ||
        std::any_of(c.rows.begin(), c.rows.end(),
                    [&](const std::vector<RowRange>& tile) { return tile[ku] != tile[i]; })) {
      continue;
    }
    // One buffer from the first step of the op that owns it (k, or the op whose buffer k wrote
    // over) to i's last; i's own request keeps no bytes.
    const int owner = c.written_over[ku] >= 0 ? c.written_over[ku] : k;
    requests[static_cast<std::size_t>(owner)].last_step = requests[i].last_step;
    requests[i].size = 0;
    c.written_over[i] = owner;
    ++shared;
  }
  if (shared == 0) return 0;
  const MemoryPlan arena = plan_memory(requests);
  c.working_set_bytes -= c.arena_bytes - arena.arena_size;
  c.arena_bytes = arena.arena_size;
  for (std::size_t i = 0; i + 1 < m; ++i) {
    const int owner = c.written_over[i];
    c.buffer_offset[i] = arena.offsets[owner >= 0 ? static_cast<std::size_t>(owner) : i];
  }
  return shared;
}

std::optional<runtime::FusedEpilogue> fuse_tile_epilogue(const graph::Graph& graph,
                                                         const TileOp& op) {
  const graph::Node& node = graph.nodes[static_cast<std::size_t>(op.node)];
  return runtime::fuse_epilogue(node, [&](int input) {
    runtime::AddOperandUse use;
    use.residual = op.inputs[static_cast<std::size_t>(input)].kind == RowMap::Kind::kSame;
    const int v = node.inputs[static_cast<std::size_t>(input)];
    if (node.op_type == "MatMul" && !use.residual && is_constant(graph, v) &&
        value_of(graph, v).constant->numel() == op.width) {
      use.bias = value_of(graph, v).constant->data<float>();
    }
    return use;
  });
}

std::optional<Column> layout_column(const graph::Graph& graph, std::vector<TileOp> ops,
                                    int64_t tile_rows, bool rolling) {
  return layout(graph, graph_facts(graph), std::move(ops), tile_rows, rolling);
}

TilePlan plan_columns(const graph::Graph& graph, const PlanOptions& options) {
  TilePlan plan;
  plan.options = options;
  const std::size_t n = graph.nodes.size();
  plan.column_of.assign(n, -1);
  plan.why_whole.assign(n, "");
  const GraphFacts facts = graph_facts(graph);
  std::vector<std::optional<TileOp>> tile_ops(n);
  for (std::size_t i = 0; i < n; ++i) {
    tile_ops[i] =
        make_tile_op(graph, static_cast<int>(i), &plan.why_whole[i], options.sparse_threshold);
  }
  // The L3 tier pays only where layer by layer spills the L3: at batch 1 ResNet-50's largest
  // activation (3.1 MiB) stays in a 32 MiB L3 anyway, and L3 columns of short row tiles lost
  // (ResNet-50 90% pruned b1 on a quiet machine: 0.80x layer by layer, against 1.00x with L2
  // columns; at b16, 49 MiB activations, 1.16-1.33x against 1.11x).
  int64_t largest = 0;
  for (const std::optional<TileOp>& op : tile_ops) {
    if (op) largest = std::max(largest, activation_bytes(*op));
  }
  const bool spills_l3 =
      static_cast<double>(largest) > options.shared_cache_fraction * options.shared_cache_bytes;
  plan.l3_tier = tier_budget(Tier::kL3, options) > options.cache_budget_bytes && spills_l3;
  // Whether layer by layer keeps a column's activations in a known L3 (not when the user's budget
  // is the only tier): then an L2 column pays only where it keeps much and computes little per byte
  // kept (why_l2_column_does_not_pay). Per column, not per graph: MobileNetV2 at batch 16 spills
  // the L3 at 112x112 but its 7x7 stage (3 MiB activations) stays there, and its L2 columns
  // (118-283 FLOPs per byte kept, one 49-pixel image per tile) ran 1.03x slower than its ops whole
  // (stacked images): depth-wise / layer by layer 1.24-1.26x -> 1.28-1.29x (2 threads, fast mode, 3
  // alternated runs); ResNet-50 90% at batch 16 (its last block's column) within noise.
  const auto l3_holds_activations = [&](const Column& c) {
    if (options.shared_cache_bytes <= 0 || options.shared_cache_fraction <= 0) return false;
    int64_t column_largest = 0;
    for (const TileOp& op : c.ops) column_largest = std::max(column_largest, activation_bytes(op));
    return static_cast<double>(column_largest) <=
           options.shared_cache_fraction * static_cast<double>(options.shared_cache_bytes);
  };
  for (std::size_t i = 0; i < n;) {
    if (!tile_ops[i]) {
      ++i;
      continue;
    }
    // A sparse linear layer that reads another one's output (BERT's FFN down projection) starts
    // no column: run whole, the two pass that activation in feature blocks, untransposed, while
    // a column's tiles would read it from memory token-major, transposing it per tile (BERT 90%
    // at batch 8, 1 MiB L2, 2 threads: such columns ran 0.92x layer by layer, none 1.01x).
    if (const int x = graph.nodes[i].inputs.empty() ? -1 : graph.nodes[i].input(0); x >= 0) {
      const int producer = value_of(graph, x).producer;
      if (producer >= 0 && tile_ops[static_cast<std::size_t>(producer)] &&
          passes_in_feature_blocks(graph, facts, *tile_ops[static_cast<std::size_t>(producer)],
                                   *tile_ops[i])) {
        plan.why_whole[i] =
            "it reads a sparse linear layer's output, which the two pass whole in feature blocks "
            "(a column would transpose it per tile)";
        ++i;
        continue;
      }
    }
    Candidates l2, l3;
    l3.done = !plan.l3_tier;
    std::vector<TileOp> ops;
    for (std::size_t end = i; end < n && tile_ops[end] && !(l2.done && l3.done) &&
                              ops.size() < static_cast<std::size_t>(options.max_column_ops);
         ++end) {
      ops.push_back(*tile_ops[end]);
      for (auto [tier, tc] : {std::pair{Tier::kL2, &l2}, std::pair{Tier::kL3, &l3}}) {
        if (tc->done) continue;
        bool valid = false;
        tc->consider(choose_tile(graph, facts, ops, tier, options, &valid), valid);
      }
    }
    // The tier whose column covers more ops: an L3 column that spans several residual blocks
    // keeps their outputs off memory, which the L2 tier (one block per column) cannot. Measured
    // (sparsecol bench, 2 threads, depth-wise / layer-by-layer medians, same binary with the L3
    // tier off and on): ResNet-50 b16 1.06x -> 1.35x, b1 1.20x -> 1.67x; ResNet-50 90% pruned
    // b16 1.21-1.29x -> 1.25-1.40x (noisy shared machine). How much of the L3 share a column
    // may fill: PlanOptions::shared_cache_fraction.
    std::optional<Column> best = l2.best ? l2.pick() : std::nullopt;
    if (l3.best) {
      std::optional<Column> deep = l3.pick();
      if (!best || deep->ops.size() > best->ops.size()) best = std::move(deep);
    }
    // A column of one op, or one whose every value is read after it (BERT: a layer norm and the
    // query projection, whose input the key and value projections read too), keeps nothing in
    // cache: the op runs whole, split across the threads.
    if (!best || best->ops.size() < 2 || best->bytes_in_cache == 0) {
      plan.why_whole[i] = whole_reason(*tile_ops[i], best, options);
      ++i;
      continue;
    }
    // A forced tile height asks for columns: only a chosen one is weighed.
    if (options.tile_rows == 0 && best->tier == Tier::kL2 && l3_holds_activations(*best)) {
      if (std::string why = why_l2_column_does_not_pay(*best); !why.empty()) {
        plan.why_whole[i] = std::move(why);
        ++i;
        continue;
      }
    }
    if (options.tile_rows > 0) {
      const Tier tier = best->tier;
      best = layout(graph, facts, std::move(best->ops), options.tile_rows, options.rolling);
      size_working_set(*best, tier, options);
    }
    for (const TileOp& op : best->ops) {
      plan.column_of[static_cast<std::size_t>(op.node)] = static_cast<int>(plan.columns.size());
      plan.why_whole[static_cast<std::size_t>(op.node)].clear();
    }
    i = static_cast<std::size_t>(best->ops.back().node) + 1;
    plan.columns.push_back(std::move(*best));
  }
  for (std::size_t i = 0; i < n; ++i) {
    const graph::Node& node = graph.nodes[i];
    if (is_view(node)) continue;
    int64_t written = 0;
    for (int v : node.outputs) written += v >= 0 ? bytes_of(graph, v) : 0;
    plan.layerwise_bytes += written;
    if (plan.column_of[i] < 0) plan.depthwise_bytes += written;
  }
  for (const Column& c : plan.columns) {
    plan.depthwise_bytes += c.bytes_to_memory;
    (c.tier == Tier::kL2 ? plan.bytes_in_l2 : plan.bytes_in_l3) += c.bytes_in_cache;
  }
  return plan;
}

std::string describe_plan(const graph::Graph& graph, const TilePlan& plan) {
  const PlanOptions& o = plan.options;
  std::string out = fmt::format(
      "depth-wise plan: L2 budget {} per core, {} threads{}{}\n", kib(o.cache_budget_bytes),
      o.threads,
      plan.l3_tier ? fmt::format(", shared L3 {} (L3 budget {} per core)",
                                 kib(o.shared_cache_bytes), kib(tier_budget(Tier::kL3, o)))
      : tier_budget(Tier::kL3, o) > o.cache_budget_bytes
          ? fmt::format(", no L3 tier (the activations fit half the {} L3 layer by layer)",
                        kib(o.shared_cache_bytes))
      : o.shared_cache_fraction <= 0 ? ", no L3 tier (the cache budget given is the only tier)"
      : o.shared_cache_bytes <= 0
          ? ", no L3 tier (no shared cache reported)"
          : fmt::format(
                ", no L3 tier (a core's share of the {} L3 is no larger than its L2 budget)",
                kib(o.shared_cache_bytes)),
      o.tile_rows > 0 ? fmt::format(", tile height forced to {} rows", o.tile_rows) : "");
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const graph::Node& node = graph.nodes[i];
    const int col = plan.column_of[i];
    if (col < 0) {
      out += fmt::format("  whole   {} '{}': {}\n", op_label(node), node.name,
                         is_view(node) ? "a view (no bytes moved)" : plan.why_whole[i]);
      continue;
    }
    const Column& c = plan.columns[static_cast<std::size_t>(col)];
    if (c.ops.front().node != static_cast<int>(i)) continue;
    int64_t shortest = c.tile_rows;  // an even split's tiles differ by a row (see layout)
    for (const std::vector<RowRange>& rows : c.rows)
      shortest = std::min(shortest, rows.back().size());
    out += fmt::format(
        "  column {} ({}): {} ops, tiles of {}{} of {} {} ({} per {}), working set {} of {} "
        "(tile buffers {}, scratch {}, weights {}{}), halo overhead {:.1f}%, intermediates in "
        "{} {}, to memory {}, {:.0f} FLOPs per byte kept\n",
        col, to_string(c.tier), c.ops.size(),
        shortest < c.tile_rows ? fmt::format("{}-", shortest) : "", c.tile_rows, c.ops.back().rows,
        c.ops.back().tokens ? "tokens" : "rows", c.tiles_per_image,
        c.ops.back().tokens ? "sequence" : "image", kib(c.working_set_bytes), kib(c.budget_bytes),
        kib(c.arena_bytes), kib(c.scratch_bytes), kib(c.weight_bytes),
        c.weights_streamed    ? " streamed from the shared cache"
        : c.tier == Tier::kL3 ? " shared by the threads"
                              : "",
        100.0 * c.halo_overhead, to_string(c.tier), kib(c.bytes_in_cache), kib(c.bytes_to_memory),
        c.flops_per_cached_byte());
    for (std::size_t k = 0; k < c.ops.size(); ++k) {
      const TileOp& op = c.ops[k];
      int64_t rows = 0;
      for (const auto& tile : c.rows) rows = std::max(rows, tile[k].size());
      const graph::Node& n = graph.nodes[static_cast<std::size_t>(op.node)];
      const std::string shape =
          op.tokens ? fmt::format("[{}, {}, {}]", op.batch, op.rows, op.width)
                    : fmt::format("[{}, {}, {}, {}]", op.batch, op.channels, op.rows, op.width);
      out += fmt::format("           {:<16} {:<28} {}  up to {} {} per tile{}{}{}\n", op_label(n),
                         "'" + n.name + "'", shape, rows, op.tokens ? "tokens" : "rows",
                         op.sparse ? ", sparse" : "",
                         c.feature_blocks[k] ? ", passed on in feature blocks" : "",
                         c.is_output(static_cast<int>(k)) ? ", to memory" : "");
    }
  }
  const double ratio = plan.depthwise_bytes > 0
                           ? static_cast<double>(plan.layerwise_bytes) / plan.depthwise_bytes
                           : 0.0;
  out += fmt::format(
      "intermediates per run: layer by layer {} to memory; depth-wise {} to memory, {} kept in "
      "L2 and {} in L3 tile buffers ({:.1f}x fewer bytes to memory)\n",
      kib(plan.layerwise_bytes), kib(plan.depthwise_bytes), kib(plan.bytes_in_l2),
      kib(plan.bytes_in_l3), ratio);
  if (plan.columns.empty()) out += "no columns: every op runs whole, layer by layer\n";
  return out;
}

}  // namespace sparsecol::plan
