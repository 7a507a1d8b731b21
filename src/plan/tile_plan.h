// The depth-wise plan: the tile algebra (which input rows an op needs for a range of its output
// rows), the partition of a graph into tensor columns, and the working-set model that sizes each
// column's tiles to a per-core cache budget (DESIGN.md, "The ideas that make it fast").
//
// A column is a run of consecutive nodes (topological order) that all work per image and per
// row range on NCHW tensors (convolutions, pooling, element-wise ops, with their fused
// epilogues), or per sequence and token range on token tensors (a transformer's linear layers,
// layer norms and what fuses into them; see TileOp).
// It may hold a sub-DAG: a residual block's skip connection is read by a later op of the same
// column. Its tiles are row blocks of one image of the column's last output (the "anchor"); per
// tile every op computes the rows its consumers in the column need (halos recomputed), into
// per-thread tile buffers; only the column's outputs (the anchor, and any value read after the
// column) are written to memory. Ops that need the whole tensor (global pooling, Gemm, MatMul of
// two activations, Flatten, Transpose, ...) run on their own, layer by layer, between columns,
// and so do tileable
// ops where a column would not pay: one op alone (nothing stays in cache), a plane so small
// that at this batch the threads would each need tiles narrower than a kernel tile (64 pixels:
// at batch 1, ResNet-50's 7x7 stage), or an L2 column whose activations the L3 holds layer by
// layer anyway and that would be compute-bound (Column::flops per byte kept: dense ResNet-50 at
// batch 1, MobileNetV2's 7x7 stage at batch 16) or keep less than twice the bytes it writes (the
// bottleneck blocks of a pruned ResNet-50 at batch 1); each such op is split across the threads
// instead.
//
// Two tiers. An L2 column keeps its tile buffers in one core's L2: short columns (about one
// residual block) of row tiles. An L3 column keeps them in the core's share of the shared L3:
// its tiles may be whole images and it may span several residual blocks or a whole stage, so
// the block outputs inside it never reach memory either. Per start node the planner takes the
// tier whose column covers more ops (see plan_columns for why that pays).
//
// Everything here is in graph terms (no kernels): the executor binds kernels to the plan.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "plan/memory_plan.h"
#include "runtime/kernel_bindings.h"
#include "scratch.h"

namespace sparsecol::plan {

// Rows [begin, end) of one image (of every channel).
struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return end <= begin; }
  bool operator==(const RowRange&) const = default;
};

// The smallest range holding both; an empty range is the identity.
RowRange hull(RowRange a, RowRange b);

// Rolling line buffers: the rows of an op's output that one tile computed (`previous`) and the
// next tile of the same image needs again, which a thread running both keeps instead of
// recomputing (the overlap of their halos). A prefix of `current`, when `current` starts inside
// `previous` and ends at or after it (the tile algebra is monotone in the tile, so it does
// whenever both are non-empty); empty otherwise, and the next tile computes all its rows.
RowRange kept_rows(RowRange previous, RowRange current);

// The tile algebra of one input of an op: the input rows that a range of output rows reads.
struct RowMap {
  enum class Kind {
    kNone,    // reads no rows: a constant, a per-channel or scalar broadcast, an absent input
    kSame,    // output row r reads input row r (element-wise, 1x1 stride-1 convolution)
    kWindow,  // a sliding window along the rows (convolution, pooling)
  };
  Kind kind = Kind::kNone;
  int64_t kernel = 1, stride = 1, dilation = 1, pad_top = 0;
  int64_t in_rows = 0;  // the input's height; kWindow clamps to [0, in_rows)

  // Output rows [r0, r1) of a window read input rows
  // [r0*stride - pad_top, (r1-1)*stride - pad_top + (kernel-1)*dilation + 1), clamped.
  RowRange input_rows(RowRange out) const;
};

// A node that can run on a tile (one image, a range of output rows).
//
// Two kinds of tensors are tiled. NCHW images (convolutions, pooling, element-wise ops): a row is
// one row of pixels of every channel. Token sequences, [batch, tokens, features] or [tokens,
// features] (one batch entry), as transformers pass them (MatMul with a constant weight,
// LayerNormalization, Softmax over the features, element-wise ops): a row is one token, seen as
// one channel `features` wide, and every op maps tokens to the same tokens (kSame), so a column
// of them needs no halo. Attention's products read every token of the sequence: they end columns.
struct TileOp {
  int node = -1;               // index into graph.nodes
  int output = -1;             // its output value
  std::vector<RowMap> inputs;  // one per node input, epilogue operands included
  bool tokens = false;         // a token sequence (channels 1, rows tokens, width features)
  int64_t batch = 0, channels = 0, rows = 0, width = 0;  // of the output, NCHW
  // Bytes of constants the kernel streams per tile: the packed sparse weight (values, offsets,
  // row pointers) when it runs through the sparse kernels, else the float weights and bias.
  int64_t weight_bytes = 0;
  // Floating-point operations per output row (all channels): 2 per multiply-add of a weighted op
  // (the weight's non-zeros only when it runs sparse), 0 for the cheap ops (pooling,
  // element-wise, normalization).
  int64_t flops_per_row = 0;
  bool sparse = false;  // a Conv or MatMul whose weight runs through the sparse kernels
  // A convolution whose images layer by layer stacks into one product at a batch above 1
  // (kernels::stacks_images).
  bool stacks_images = false;
  // Per-thread kernel scratch per output row (im2col columns, the padded window copies, the
  // sparse kernels' zero-padded input rows, a linear layer's packed or transposed tokens), and
  // its cap (the kernels work in chunks).
  int64_t scratch_bytes_per_row = 0;
  int64_t scratch_cap_bytes = 0;
  int64_t row_bytes() const { return channels * width * 4; }  // one output row, all channels
  // Floats from one channel plane of a tile buffer of `rows` rows to the next: whole cache lines,
  // so that every plane starts on one (the sparse 1x1 convolutions read such planes in place and
  // copy any others, f32-conv/conv.cc).
  int64_t plane_floats(int64_t rows) const { return kernels::round_up_to_line(rows * width); }
};

// The node as a tile op, or nullopt with `why_not` saying why it needs the whole tensor.
// `sparse_threshold` as Options::sparse_threshold (which Conv weights the sparse kernels run).
std::optional<TileOp> make_tile_op(const graph::Graph& graph, int node, std::string* why_not,
                                   double sparse_threshold = -1.0);

// The node's epilogue as the tile kernels fuse it (runtime::fuse_epilogue): an Add fuses as the
// residual when its operand is a same-shape tensor on the tile, as a MatMul's bias when it is a
// constant vector along the features; nullopt where it does not fit (the kernel's result then
// goes through the generic epilogue).
std::optional<runtime::FusedEpilogue> fuse_tile_epilogue(const graph::Graph& graph,
                                                         const TileOp& op);

enum class Tier { kL2, kL3 };
const char* to_string(Tier tier);

struct PlanOptions {
  int64_t cache_budget_bytes = 512 * 1024;  // the executor's: 3/4 of one core's L2 (hwloc)
  // The L3 (hwloc), shared by the threads; 0: unknown or not to be used (no L3 tier).
  int64_t shared_cache_bytes = 0;
  // The fraction of a thread's share of the L3 (shared_cache_bytes / threads) an L3 column's
  // working set may fill: the rest holds the column's inputs and outputs streaming through.
  // 0.6 rather than 0.5: ResNet-50's layer-1/2 column then takes layer 2's first block and
  // layer 3 fits two columns instead of three, so at batch 16 its intermediates to memory fall
  // from 142.6 to 93.6 MiB (4.8x -> 7.4x fewer than layer by layer) at the same speed (2
  // threads, fast mode, alternated rounds; depth-wise / layer by layer at 0.5 vs 0.6:
  // 1.075-1.080x vs 1.057-1.074x and 1.056-1.109x vs 1.066-1.090x; ResNet-50 90% 1.276-1.296x vs
  // 1.274-1.288x, 1.277-1.280x at 0.75; docs/BENCHMARKS.md, the twenty-first session).
  double shared_cache_fraction = 0.6;
  int64_t tile_rows = 0;  // forced tile height of every column (0: chosen)
  int threads = 1;
  double sparse_threshold = -1.0;  // Options::sparse_threshold
  // Options::tile_reuse == kRolling: a tile buffer that keeps rows for the next tile lives
  // through the whole tile, so it shares its bytes with no other buffer (a larger arena).
  bool rolling = true;
  // A column grows only while the rows it recomputes stay below this fraction of the useful
  // rows (halo recomputation costs FLOPs; a column that is too deep loses more than it saves).
  double max_halo_overhead = 0.3;
  int max_column_ops = 24;  // bounds the planner's search, far above any useful column
};

struct Column {
  Tier tier = Tier::kL2;     // where the tile buffers live
  std::vector<TileOp> ops;   // consecutive nodes; ops.back() produces the anchor
  std::vector<int> inputs;   // values read from memory (produced before, or graph inputs)
  std::vector<int> outputs;  // values written to memory, the anchor first
  int64_t batch = 0, tile_rows = 0, tiles_per_image = 0;
  // rows[t][i]: rows of ops[i]'s output that tile t computes; own[t][i]: the rows tile t writes
  // to memory (ops whose output is a column output; the tiles' own rows partition the tensor).
  std::vector<std::vector<RowRange>> rows, own;
  // Per-thread tile buffers: byte offset of ops[i]'s in the thread's arena, -1 for the anchor
  // (written straight to memory); buffers whose lifetimes within a tile do not overlap share
  // bytes, except rolling buffers that keep rows for the next tile (PlanOptions::rolling).
  std::vector<int64_t> buffer_offset;
  // The arena's requests, per op but the anchor: bytes, and the ops (as steps) through which the
  // buffer holds its rows (to the end of the tile when it keeps rows for the next one).
  std::vector<BufferRequest> buffer_requests;
  // written_over[i]: the op whose tile buffer ops[i] writes its output into, over its fused
  // residual (share_residual_buffers): the residual's producer, or the op whose buffer that one
  // wrote over in turn; -1 for a buffer of its own.
  std::vector<int> written_over;
  // feature_blocks[i]: ops[i]'s tile buffer holds its tokens in the sparse linear kernel's
  // feature blocks (kernels::TokenLayout::kFeatureBlocks), not token-major: a sparse linear
  // layer's output that only the next one reads, as its input 0 (BERT's FFN), on tiles of whole
  // blocks. It is copied out of one kernel and into the other instead of transposed twice.
  std::vector<bool> feature_blocks;
  int64_t arena_bytes = 0, scratch_bytes = 0, weight_bytes = 0;
  // What one core keeps hot per tile, against its tier's budget. L2: arena + scratch + the
  // weights, unless they do not fit beside the rest: then they are streamed from the shared
  // cache on every tile. L3: arena + scratch + the core's share of the weights (all threads
  // read the same ones).
  int64_t working_set_bytes = 0;
  int64_t budget_bytes = 0;  // the tier's budget it fits
  bool weights_streamed = false;
  double halo_overhead = 0.0;            // recomputed output elements / useful ones
  int64_t bytes_in_cache = 0;            // per run: intermediates that never leave the tile buffers
                                         // (in the column's tier: L2 or L3)
  int64_t bytes_to_memory = 0;           // per run: the column's outputs
  int64_t flops = 0;                     // per run: its ops' useful rows (TileOp::flops_per_row)
  bool is_output(int op) const;          // ops[op]'s output is written to memory
  double flops_per_cached_byte() const;  // flops / bytes_in_cache
};

// Where the kernel of ops[i] may write its output over its fused residual (`may_overwrite[i]`,
// from the kernels: kernels::PackedConv::may_overwrite_residual) and the column allows it, the two
// share one tile buffer and the arena is planned again (it and the working set only shrink). The
// column allows it where the residual is the output of an earlier op of the column that ops[i]
// reads only as its residual and that nothing reads after ops[i], of the same rows as ops[i]'s
// on every tile, neither of them keeping rows for the next tile. Then every residual element is
// read just before its output element is written, as layer by layer: the stores hit lines the
// epilogue has just read instead of missing in cache, and the column's arena is smaller.
// ResNet-50 at batch 16 (whole-image tiles in L3 columns: 11 of its 16 block-final 1x1 layers
// pruned 90% or 95%, 5 dense), 2 threads, Zen 4, depth-wise medians in alternated processes:
// 90% 190.5 -> 176 ms (4 pairs; over layer by layer in the same processes 1.26x -> 1.29x), 95%
// 146 -> 129 ms (3 pairs; 1.34x -> 1.48x), dense within noise. Returns how many it shared.
int share_residual_buffers(const graph::Graph& graph, Column& c,
                           const std::vector<bool>& may_overwrite);

struct TilePlan {
  std::vector<Column> columns;
  std::vector<int> column_of;          // per node: its column, or -1 when it runs whole
  std::vector<std::string> why_whole;  // per node outside columns: why ("" inside)
  PlanOptions options;
  int64_t layerwise_bytes = 0;  // per run: every node output written to memory (views excluded)
  int64_t depthwise_bytes = 0;  // per run: column outputs plus outputs of nodes run whole
  int64_t bytes_in_l2 = 0, bytes_in_l3 = 0;  // per run: intermediates kept in tile buffers
  // Whether L3 columns were considered: a budget above L2's, and activations that spill the L3
  // layer by layer (plan_columns).
  bool l3_tier = false;
};

// Partitions a specialized graph (every shape concrete) into columns, greedily: from each
// tileable node, the longest run of tileable nodes that forms a valid column whose working set
// fits a tier's budget at some tile height and whose halo overhead stays under the limit; or a
// run not much shorter that ends where a block ends (one output), and then not on an op that
// widens what it writes where the op before it also ends a block (see Candidates in
// tile_plan.cc).
TilePlan plan_columns(const graph::Graph& graph, const PlanOptions& options);

// Lays out one candidate column with tile height `tile_rows` (rows, ownership, buffers, working
// set, byte counts); nullopt when it is not a valid column (an intermediate that no op of the
// column reads, ops of different batch sizes). `rolling`: as PlanOptions::rolling.
std::optional<Column> layout_column(const graph::Graph& graph, std::vector<TileOp> ops,
                                    int64_t tile_rows, bool rolling = true);

// The report `sparsecol inspect --plan` prints.
std::string describe_plan(const graph::Graph& graph, const TilePlan& plan);

}  // namespace sparsecol::plan
