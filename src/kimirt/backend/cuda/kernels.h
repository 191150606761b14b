// Launchers of the CUDA backend's kernels (cuda_backend.cu calls them; the *.cu files beside this
// define them). All FP32, all on the caller's stream, all deterministic: every reduction runs
// in one fixed order (fixed block shapes, tree reductions in shared memory, no atomics), so the
// same inputs give the same bits on every run, whatever else the GPU is doing.
//
// Layouts are the Backend's (backend.h): contiguous row-major, T = tokens of the call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "kimirt/backend/kda_decode_args.h"

namespace kimirt::cuda {

// --- elementwise_kernels.cu ---
void Add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s);
// y [T, count] = columns [begin, begin + count) of x [T, C]: a kernel under PDL, where a 2-D
// copy is a graph node that ends the chain's overlap (the next kernel waits for it to finish,
// then launches: the kernel tracer charged the MLA layer's kv_a norm after the two copies of
// the latent and rope columns 4-8 µs, a norm elsewhere 2.5).
void CopyColumns(const float* x, int64_t T, int64_t C, int64_t begin, int64_t count, float* y, cudaStream_t s);
void SigmoidMul(const float* x, const float* g, float* y, int64_t n, cudaStream_t s);
// kind 0: silu(gate)·up; kind 1: SiTU with beta and, if has_linear_beta, the up soft cap.
void Glu(const float* gate, const float* up, float* y, int64_t n, int kind, float beta, bool has_linear_beta,
         float linear_beta, cudaStream_t s);
// table F32 or BF16 (rows widened exactly).
void Embedding(const int32_t* ids, int64_t T, const void* table, bool table_bf16, int64_t V, int64_t D,
               int64_t row_begin, float* y, cudaStream_t s);

// --- argmax_kernels.cu: greedy decoding's pick per row (Backend::ArgmaxRows, core/argmax.h) ---
// ids[r] = ArgmaxOf(x[r, :V]) for r < R; scratch holds ArgmaxRowsScratchBytes(R).
size_t ArgmaxRowsScratchBytes(int64_t R);
void ArgmaxRows(const float* x, int64_t R, int64_t V, void* scratch, int32_t* ids, cudaStream_t s);

// --- weight_kernels.cu: few-row GEMMs, BF16-held weights ---
// Up to this many rows, GEMMs run as DecodeGemm (BF16 weights) or Gemv (F32 weights), both
// row-invariant; more go to cuBLAS.
constexpr int64_t kGemvMaxRows = 64;
// y [m, n] = x [m, k] · w [n, k]ᵀ, w F32 or BF16; each row computed as it would be alone, a BF16
// weight's bits those of the same weight widened to F32 (CudaBackendGemv tests). FP32 cores: the
// F32-held weights and the router (spec §7.2: F32 math on the stored BF16 weight); other BF16
// weights decode through DecodeGemm.
void Gemv(const float* x, const void* w, bool w_bf16, float* y, int64_t m, int64_t n, int64_t k, cudaStream_t s);
void Bf16ToF32(const void* src, float* dst, int64_t n, cudaStream_t s);

// --- decode_gemm.cu: BF16-weight GEMM for 1..kGemvMaxRows rows on tensor cores ---
// y [m, n] = x [m, k] · w [n, k]ᵀ with w BF16, x split into three BF16 parts (all of F32), F32
// accumulation; the weight is read once whatever m is, and each row's bits are those it gets
// alone (the k split and every summation order depend on n and k only). `scratch` is device
// memory of DecodeGemmScratchBytes(m, n, k) bytes, 256-byte aligned, used on stream `s` only.
size_t DecodeGemmScratchBytes(int64_t m, int64_t n, int64_t k);
// Blocks k is split across for an [n, k] weight (1 = no split); for tests and benches.
int64_t DecodeGemmSplits(int64_t n, int64_t k);
// `w_tiled`: w is in the decode-tiled layout TileWeightForDecode makes (the same products in the
// same order, so the same bits; each warp's loads are contiguous runs instead of 64-byte pieces
// of 8 rows).
void DecodeGemm(const float* x, const void* w_bf16, float* y, int64_t m, int64_t n, int64_t k, void* scratch,
                cudaStream_t s, bool w_tiled = false);
// Whether an [n, k] weight can be tiled: n % 32 == 0 and k % 128 == 0.
bool DecodeGemmTileable(int64_t n, int64_t k);
// w [n, k] BF16 row-major → `tiled` (n · k BF16, another buffer, 16-byte aligned) in the layout
// DecodeGemm reads with w_tiled (decode_gemm.cu, DecodeTiledOffset). DecodeGemmTileable(n, k).
void TileWeightForDecode(const void* w_bf16, void* tiled, int64_t n, int64_t k, cudaStream_t s);
// Several DecodeGemms of one row count m in one GEMM launch and at most one split-sum launch
// (plus SplitXKernel once per distinct x at m > 16): problem i's y gets exactly the bits
// DecodeGemm gives it alone (its own plan, block work and sum order; docs/cuda.md "Grouped decode
// GEMMs"). The ys are distinct and no y is an x. `scratch`: DecodeGemmGroupScratchBytes bytes,
// 256-byte aligned, used on `s` only.
struct DecodeGemmProblem {
  const float* x;  // [m, k]
  const void* w;   // [n, k] BF16
  float* y;        // [m, n]
  int64_t n, k;
  bool w_tiled = false;  // w in TileWeightForDecode's layout
};
size_t DecodeGemmGroupScratchBytes(int64_t m, const DecodeGemmProblem* problems, int count);
void DecodeGemmGroup(int64_t m, const DecodeGemmProblem* problems, int count, void* scratch, cudaStream_t s);

// --- prefill_gemm.cu: BF16-weight GEMM for prefill (more than kGemvMaxRows rows) on tensor cores ---
// y [m, n] = bf16(x) [m, k] · w [n, k]ᵀ: x rounded to BF16 (nearest even), w BF16, F32
// accumulation and output (Backend::bf16_prefill; docs/cuda.md "Prefill GEMMs on tensor cores").
// Batch-invariant: one fixed 128 × 128 tile, k in ascending order, no split, so a row's bits
// depend on its x row, w, n and k only. Any m, n, k ≥ 1 (m, n ≤ 2³¹); `scratch` is device
// memory of PrefillGemmScratchBytes(m, n, k, w_bf16) bytes, 256-byte aligned, used on `s` only.
// `w_tiled`: w decode-tiled (TileWeightForDecode; the wgmma tile reads it, the same bits).
size_t PrefillGemmScratchBytes(int64_t m, int64_t n, int64_t k, const void* w_bf16);
void PrefillGemm(const float* x, const void* w_bf16, float* y, int64_t m, int64_t n, int64_t k, void* scratch,
                 cudaStream_t s, bool w_tiled = false);
// The same product with y [m, n] in BF16: each F32 sum rounded to nearest even as it is stored,
// the bits ToBf16 gives of PrefillGemm's y (MLA prefill's expansion, whose keys and values go to
// the attention in BF16: half the bytes written, none read back). Same scratch; always the wgmma
// tile.
void PrefillGemmBf16Out(const float* x, const void* w_bf16, void* y_bf16, int64_t m, int64_t n, int64_t k,
                        void* scratch, cudaStream_t s);
// The same product on the mma.sync tile (tc_tile.cuh), which PrefillGemm ran before its wgmma
// tile: the same bits (CudaBackendPrefillGemm.WgmmaGivesTheMmaSyncBits), kept as the second
// implementation the test holds the wgmma tile to.
void PrefillGemmMmaSync(const float* x, const void* w_bf16, float* y, int64_t m, int64_t n, int64_t k, void* scratch,
                        cudaStream_t s);

// --- norm_kernels.cu ---
// Byte ranges of weights asked into L2 (cp.async.bulk.prefetch.L2) by blocks of one warp, on a
// stream beside the decode chain (Backend::PrefetchWeights). A hint: changes no result.
struct L2Range {
  const void* p;
  int64_t bytes;
};
constexpr int kMaxL2Ranges = 16;
void PrefetchL2Ranges(const L2Range* ranges, int count, cudaStream_t s);
void RmsNorm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y, cudaStream_t s);
// h = a + b (as Add), then y = RmsNorm(h) (as RmsNorm): one kernel for rows up to 8,192 wide.
// h and y alias neither a nor b.
void AddRmsNorm(const float* a, const float* b, const float* w, float eps, int64_t rows, int64_t n, float* h, float* y,
                cudaStream_t s);
// rows of K: y = x·rstd·w·sigmoid(g) (spec §3.2).
void GatedRmsNorm(const float* x, const float* g, const float* w, float eps, int64_t rows, int64_t K, float* y,
                  cudaStream_t s);
// The candidates' device pointers, each [T, D], passed by value in the launch (no upload, so a
// decode step with AttnRes can be captured in a graph) (spec §8.2).
constexpr int kAttnResMaxCandidates = 128;
struct AttnResCandidates {
  const float* p[kAttnResMaxCandidates];
  int n = 0;
};
void AttnResMix(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps, int64_t T,
                int64_t D, float* y, cudaStream_t s);
// y = RMSNorm(out_w, out_eps) of AttnResMix's y, as one kernel (the mix not stored): the bits of
// AttnResMix then RmsNorm (CudaBackendTest.AttnResMixNormGivesMixThenNormsBits). Rows up to
// 8,192 wide (AttnResMixNormSupported).
bool AttnResMixNormSupported(int64_t D);
void AttnResMixNorm(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps,
                    const float* out_w, float out_eps, int64_t T, int64_t D, float* y, cudaStream_t s);
// The mix (out_w null) or the mix's RMSNorm (out_w [D], out_eps) with each row over a cluster of 8
// blocks (the held kernels: one block a row): its own fixed order of the sums (a row's bits the
// same at every T, not the held kernels'). Rows up to 8,192 wide (AttnResMixClusterSupported).
bool AttnResMixClusterSupported(int64_t D);
// From this many candidates the backend takes the cluster kernels (CudaBackend::AttnResCluster):
// one H100, K3's width, attnres_bench (bench/results/2026-12-06-h100-attnres-cluster-ab.json), mix
// + norm µs a call held / cluster at batch 1: 2 candidates 4.70 / 5.39, 5: 7.93 / 6.53, 9: 13.13 /
// 8.19 (the held block reads the row twice through one multiprocessor; the cluster's barriers cost
// more than that at 2). A function of the layer, never of the batch.
constexpr int kAttnResClusterFromCandidates = 4;
void AttnResMixCluster(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps,
                       const float* out_w, float out_eps, int64_t T, int64_t D, float* y, cudaStream_t s);
// The first AttnResMix kernel (a block a row, read in loops): what AttnResMix runs for rows wider
// than 8,192, and the reference its held kernel must match bit for bit (CudaBackendTest.
// AttnResMixHeldKernelGivesTheLoopKernelsBits).
void AttnResMixLoop(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps, int64_t T,
                    int64_t D, float* y, cudaStream_t s);

// --- kda_kernels.cu (spec §5) ---
void CausalConvSilu(const float* x, int64_t T, int64_t C, const float* w, int64_t W, float* window, float* y,
                    cudaStream_t s);
void KdaLogDecay(const float* f, int64_t T, int64_t H, int64_t K, const float* a_log, const float* dt_bias,
                 bool has_lower_bound, float lower_bound, float* alpha, cudaStream_t s);
void KdaRecurrent(const float* q, const float* k, const float* v, const float* beta_logits, const float* alpha,
                  int64_t T, int64_t H, int64_t K, float* state, float* o, cudaStream_t s);

// --- kda_decode_kernels.cu: the fused KDA decode step (spec §5; kda_decode_args.h) ---
// One launch for a.rows sequences × a.heads heads, one token each: conv + SiLU of q, k, v with
// each row's slot window (updated), l2norm of q and k (spec §3.4), the decay gate (K3 bounded
// sigmoid or Kimi-Linear softplus, spec §5.3), beta = sigmoid(logit), the delta-rule update of
// recurrent[slots[b]] in place (spec §5.4, the CPU recurrent reference's op order) and o = q̂ᵀS,
// then the gated RMSNorm with the output gate (spec §5.6) into a.out [B, P]; o_proj stays
// outside. Every pointer is device memory (slots too); slots must be distinct within a call and
// in range (not checked on the device). Equal to cpu::KdaDecode up to FP32 rounding; each row's
// bits are independent of the other rows (one block or cluster per (head, row), nothing shared
// between rows).
// Needs head_dim == kKdaDecodeHeadDim, 1 <= conv_taps <= 4, rows <= 65535; aborts otherwise.
// variant picks how the work is split (all the same math; kda_decode_kernels.cu says more; the
// bench, bench/kda_decode_bench.cu, times each). column2/column3 give the same bits; each split
// variant sums over d in its own fixed order, so its bits differ from the others' by rounding,
// never between batches.
constexpr int kKdaDecodeHeadDim = 128;
enum class KdaDecodeVariant : int {
  kColumn2,        // a block of K threads per (head, row), thread j holds S[:, j]; 2 blocks/SM
  kColumn3,        // the same, capped for 3 blocks/SM (spills a little)
  kSplit256,       // a block of 256 threads per (head, row), a thread holds 4 columns × 16 rows
  kSplit512,       // 512 threads, 4 columns × 8 rows
  kSplit512Plain,  // split512 without the streaming cache hints on the state
  kCluster2x128,   // a cluster of 2 blocks per (head, row), 64 columns each; 128 threads, 4 × 16
  kCluster2x256,   // the same with 256 threads, 4 × 8
  kCluster4x128,   // 4 blocks of 32 columns; 128 threads, 4 × 8
  kCluster8x128,   // 8 blocks of 16 columns; 128 threads, 4 × 4
};
inline constexpr KdaDecodeVariant kKdaDecodeVariants[] = {
    KdaDecodeVariant::kColumn2,      KdaDecodeVariant::kColumn3,      KdaDecodeVariant::kSplit256,
    KdaDecodeVariant::kSplit512,     KdaDecodeVariant::kSplit512Plain, KdaDecodeVariant::kCluster2x128,
    KdaDecodeVariant::kCluster2x256, KdaDecodeVariant::kCluster4x128, KdaDecodeVariant::kCluster8x128};
// The variant the CUDA backend's decode step runs (and the default below). One variant for every
// batch size: switching by batch would change a row's bits with the batch (batch invariance).
// Flip it after `bash scripts/gpu_check.sh kdabench` shows a faster one.
inline constexpr KdaDecodeVariant kKdaDecodeProduction = KdaDecodeVariant::kSplit512Plain;
const char* KdaDecodeVariantName(KdaDecodeVariant v);
void KdaDecode(const KdaDecodeArgs& a, cudaStream_t s, KdaDecodeVariant variant = kKdaDecodeProduction);

// --- kda_chunk_kernels.cu: chunked KDA prefill on tensor cores (spec §5.5, docs/cuda.md) ---
// The KDA core (q̂ = l2norm(q)/sqrt(K), k̂ = l2norm(k), β = sigmoid(logit), per-channel
// log-decay α, delta rule; cpu::KdaRecurrent's function) over a batch of sequences in chunks of
// 64 tokens: sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1] of q, k, v, alpha [rows, H, K],
// beta_logits [rows, H] and o [rows, H, K] (fully written), and reads and updates the state
// state[slots[b]] of a pool [slot_count, H, K, K] (row = key channel) in place. Device pointers
// (cu_seqlens and slots too, int32); slots distinct within a call (not checked on the device);
// q, k, v, alpha, o 16-byte aligned. Needs head_dim == kKdaChunkHeadDim; aborts otherwise.
// F32 mode (bf16_operands false): one fused kernel, matmuls on tensor cores with F32 operands
// split into three BF16 parts (F32 math up to summation order). BF16 prefill mode: the
// chunk-parallel form (per-chunk intermediates in `scratch`, then a sequential pass over the
// state), every MMA operand one BF16 part with F32 accumulation, F32 state; needs scratch of
// KdaChunkScratchBytes(tokens, batch, heads) bytes (16-byte aligned) and tokens = all rows of the
// call (cu_seqlens[batch]; aborts without scratch). A sequence's bits depend on its own rows and
// state only (batch invariance), for any value_block (0 = KdaChunkValueBlock's choice; 32, 64 or
// 128 value columns per thread block).
constexpr int kKdaChunkHeadDim = 128;
struct KdaChunkArgs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* beta_logits = nullptr;
  const float* alpha = nullptr;
  // [batch + 1], non-decreasing, from 0. Null: one sequence of `tokens` rows on slot 0 (slots
  // null too; nothing to upload, so a launch inside a graph capture bakes in no host data).
  const int32_t* cu_seqlens = nullptr;
  const int32_t* slots = nullptr;  // [batch]
  int64_t tokens = 0;              // rows of the call (needed by the BF16 mode with cu_seqlens too)
  float* state = nullptr;          // [slot_count, H, K, K]
  float* o = nullptr;
  void* scratch = nullptr;  // BF16 mode: KdaChunkScratchBytes(tokens, batch, heads) bytes
  int64_t batch = 0, heads = 0, head_dim = 0;
};
// The value columns per thread block KdaChunked picks. F32 mode: the fewest (32, then 64) whose
// blocks still fit in one wave over the GPU's multiprocessors, else 128. BF16 mode (the state
// kernel): 32 while 3 blocks per multiprocessor hold them all, else 64.
int KdaChunkValueBlock(int64_t batch, int64_t heads, bool bf16_operands);
// Device scratch the BF16 mode needs: 74,240 bytes per chunk and head for at most
// tokens / 64 + batch chunks, and the chunk map (12 bytes per chunk and sequence).
size_t KdaChunkScratchBytes(int64_t tokens, int64_t batch, int64_t heads);
void KdaChunked(const KdaChunkArgs& a, cudaStream_t s, bool bf16_operands, int value_block = 0);
// The BF16 mode's chunk-parallel part alone (its map and prep kernels: records written to
// a.scratch, state and o untouched), so kda_chunk_bench can split the mode's time between the
// parallel and the sequential kernel. prep_blocks_per_sm picks the prep kernel's build: 0 or 3
// the one KdaChunked runs (3 blocks per multiprocessor, 80 registers), 2 the 128-register build
// (same arithmetic, same records: an A/B of occupancy against registers); aborts otherwise.
void KdaChunkPrepOnly(const KdaChunkArgs& a, cudaStream_t s, int prep_blocks_per_sm = 0);

// --- mla_kernels.cu (spec §6.4, §6.6) ---
// Causal softmax attention of query (t, h) over positions 0 .. start+t, with a key made of two
// parts (a per-head part and a part shared by all heads) and a value. Element pointers:
//   query  q  + t·q_t + h·q_h            [da + db]
//   key a  ka + s·ka_s + h·ka_h          [da]
//   key b  kb + s·kb_s                   [db]   (may be null when db = 0)
//   value  v  + s·v_s + h·v_h            [dv]
//   output o  + t·o_t + h·o_h            [dv]
struct AttentionArgs {
  const float* q = nullptr;
  int64_t q_t = 0, q_h = 0;
  const float* ka = nullptr;
  int64_t ka_s = 0, ka_h = 0, da = 0;
  const float* kb = nullptr;
  int64_t kb_s = 0, db = 0;
  const float* v = nullptr;
  int64_t v_s = 0, v_h = 0, dv = 0;
  float* o = nullptr;
  int64_t o_t = 0, o_h = 0;
  int64_t T = 0, H = 0, start = 0;
  float scale = 1.0f;
};
constexpr int64_t kAttentionMaxValueDim = 1024;
constexpr int64_t kAttentionMaxQueryDim = 2048;
void CausalAttention(const AttentionArgs& a, cudaStream_t s);
// Weight absorption (spec §6.6): qc[t,h] = [W_UK,hᵀ q_n(t,h) ‖ q_s(t,h)]  ([T, H, r + dr]).
void AbsorbQuery(const float* q, int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t r,
                 const void* w_kvb, bool w_bf16, float* qc, cudaStream_t s);
// o[t,h] = W_UV,h ō(t,h)  (ō [T, H, r] → o [T, H·dv]).
void AbsorbOutput(const float* o_bar, int64_t T, int64_t H, int64_t dn, int64_t dv, int64_t r,
                  const void* w_kvb, bool w_bf16, float* o, cudaStream_t s);

// Paged absorbed MLA decode (spec §6.6), flash-decoding style: the latent codes are read where
// they lie through each sequence's block table. A sequence of context L is cut into splits of
// MlaDecodeSplitLen(L) positions (a function of L alone, so a row's bits never depend on the
// batch); one thread block per (split, group of heads) keeps an online softmax over its split,
// and a combine pass merges the splits of each (sequence, head) in split order.
struct PagedDecodeArgs {
  const void* values = nullptr;  // codes [blocks, layers, block_size, r + dr]
  const float* scales = nullptr;  // FP8: [blocks, layers, block_size, 2]
  int kind = 0;                   // 0 F32, 1 BF16, 2 FP8 E4M3
  int layers = 0, layer = 0, block_size = 0;
  int64_t r = 0, dr = 0, B = 0, H = 0;
  float scale = 1.0f;
  // Device metadata of the step (KvStorage::SetDecodeStep): the work count, per sequence
  // context [B], table_begin [B + 1] into tables, split_begin [B + 1] into the work list, and
  // the work list of (sequence, first position, end position). num_work is the list's capacity
  // (the grid: blocks past *work_count exit), so one launch shape serves every step of a graph.
  const int32_t* work_count = nullptr;
  const int32_t* context = nullptr;
  const int32_t* table_begin = nullptr;
  const int32_t* tables = nullptr;
  const int32_t* split_begin = nullptr;
  const int32_t* work = nullptr;
  int64_t num_work = 0;
  // The persistent split's schedule (MlaDecodeVariant::kWgmma): block p of persist_blocks walks
  // work items block_work[p] .. block_work[p + 1] − 1 (MlaDecodePersistSchedule). Which block runs
  // an item never changes its sums, so this may look at the whole step.
  const int32_t* block_work = nullptr;
  int64_t persist_blocks = 0;
  int64_t pool_rows = 0;  // rows of `values` (blocks · layers · block_size): the TMA split's tensor map
  // L2 hints (MlaPagedDecode sets them; on unless KIMIRT_MLA_L2_HINTS=0, read once a process): the
  // wgmma-ws split stores its partial outputs evict-last, so the combine finds them in L2, and the
  // combine reads them evict-first (the same values: the same bits).
  bool l2_hints = false;
  // The TMA split's latent rows (read once a step) asked evict-first: MlaPagedDecode sets it where
  // the step's items are one wave of blocks (KIMIRT_MLA_L2_ROW_HINT=0 / 1 forces it; docs/cuda.md
  // "The latent rows asked evict-first").
  bool l2_row_hint = false;
};
constexpr int64_t kMlaDecodeMaxLatent = 512, kMlaDecodeMaxRope = 128;
int64_t MlaDecodeSplitLen(int64_t context);
// The current device's multiprocessors (132 where it cannot say).
int SmCount();
// The persistent split's schedule (one block an SM: its shared memory allows no second):
// block_work [blocks + 1] for the work list `work` (triples of sequence, first, end position):
// contiguous runs of items, cut where each block's share of the step's cost (tiles of 32
// positions, plus one a item for its stores) is reached, so a block keeps one sequence's query
// across consecutive splits and its copy ring runs on from one item into the next.
std::vector<int32_t> MlaDecodePersistSchedule(std::span<const int32_t> work, int64_t blocks);
// ō [B, H, r] of the absorbed queries qc [B, H, r + dr] (AbsorbQuery). part_o [num_work, H, r]
// and part_ml [num_work, H, 2] are scratch for the splits.
void MlaPagedDecode(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml, float* o_bar,
                    cudaStream_t s);
// --- mla_decode_kernels.cu: MlaPagedDecode's split on tensor cores, for BF16 and FP8 latents of
// the models' widths (512 + 64); the others take the CUDA-core split ---
bool MlaPagedDecodeTcSupported(const PagedDecodeArgs& a);
// Shapes of that split (KIMIRT_MLA_DECODE_VARIANT=ring4|ring2|wgmma|wgmma-item|wgmma-ws|wgmma-ws-tma, read once
// a process, so a captured graph and the eager calls of a run use the same kernel; an unknown name
// aborts naming it). ring4 (one block an SM, a 4-stage cp.async ring) and ring2 (two blocks an SM,
// 2 stages) run the same sums in the same order on mma.sync, so the same bits
// (mla_decode_kernels.cu). wgmma (mla_decode_wgmma.cu) puts 32 heads' two BF16 parts in one m64
// wgmma: its own sums, held to the CPU at the same bar; BF16 and FP8 latents. Measured on an H200
// (docs/cuda.md "MLA decode on wgmma"; against ring2, the whole call at 32 heads): BF16 34 against
// 51 µs at 32K, 74 against 120 at 128K; FP8 37 against 51, 95 against 132. wgmma-item is wgmma's
// kernel one block an item (the schedule before the persistent one): the same sums, so the same
// bits. wgmma-ws splits wgmma's roles by warpgroup — one scores and runs the softmax a tile
// ahead, two accumulate ō and copy the tiles: its own sums (S over 36 k steps in one
// accumulator), BF16 rows (FP8 rows take wgmma's kernel); on an H100 0.90-0.93× wgmma's time at
// batch 8-32, the same at batch 1 (docs/cuda.md "The warp-specialized split"). wgmma-ws-tma (the
// default) is wgmma-ws with the tiles copied by TMA — one thread of each accumulating warpgroup
// asks for its panels in boxes of a paged block's rows (blocks of 8, 16 or a multiple of 32
// rows; other blocks take wgmma-ws) — the same sums, so wgmma-ws's bits; on an H100 0.96-0.98×
// wgmma-ws's time (docs/cuda.md "TMA copies in the ws split"). FP8 rows in the ws split were
// tried and measured slower than wgmma's kernel (docs/cuda.md "Tried and dropped: FP8 rows in
// the ws split"); wgmma's kernel widens them a tile ahead instead, beside the tensor cores' ō
// (docs/cuda.md "FP8 rows widened a tile ahead").
enum class MlaDecodeVariant : int { kRing4 = 0, kRing2 = 1, kWgmma = 2, kWgmmaItem = 3, kWgmmaWs = 4, kWgmmaWsTma = 5 };
inline constexpr MlaDecodeVariant kMlaDecodeVariants[] = {MlaDecodeVariant::kRing4, MlaDecodeVariant::kRing2,
                                                          MlaDecodeVariant::kWgmma, MlaDecodeVariant::kWgmmaItem,
                                                          MlaDecodeVariant::kWgmmaWs, MlaDecodeVariant::kWgmmaWsTma};
MlaDecodeVariant ParseMlaDecodeVariant(const char* name);  // null or "" = wgmma-ws-tma
const char* MlaDecodeVariantName(MlaDecodeVariant v);
MlaDecodeVariant CurrentMlaDecodeVariant();
// Overrides the environment's choice for the rest of the process (tests run every variant);
// graphs captured before keep the kernel they captured.
void SetMlaDecodeVariant(MlaDecodeVariant v);
void MlaPagedDecodeSplitTc(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml, cudaStream_t s);
// --- mla_decode_wgmma.cu: the split as MlaDecodeVariant::kWgmma, BF16 and FP8 latents of 512 + 64 ---
bool MlaPagedDecodeWgmmaSupported(const PagedDecodeArgs& a);
// persistent: a.persist_blocks blocks walk a.block_work's runs of items; else one block an item.
void MlaPagedDecodeSplitWgmma(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml,
                              bool persistent, cudaStream_t s);
// --- mla_decode_ws.cu ---
// The warp-specialized split (MlaDecodeVariant::kWgmmaWs; latents of MlaPagedDecodeWgmmaSupported)
// over a.block_work's runs, or one block an item without them; `tma`: its TMA copies where the
// block size allows. FP8 rows go to MlaPagedDecodeSplitWgmma.
void MlaPagedDecodeSplitWgmmaWs(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml,
                                cudaStream_t s, bool tma = false);
// The ws split's launches so far in this process, by copy form: what a test checks to know the
// form it meant to run did run (a refused tensor map or a block size falls back to another).
struct MlaDecodeWsLaunches {
  int64_t cp_async = 0, tma = 0;
};
MlaDecodeWsLaunches MlaDecodeWsLaunchCounts();

// --- mla_prefill_kernels.cu: expanded MLA prefill on tensor cores (spec §6.4; issue 14) ---
// Causal flash attention of the new tokens of a varlen batch of sequences over their expanded
// keys and values: sequence b's count new queries at positions start .. start + count - 1 see
// its keys 0 .. position. Per head h the key is k_nope ‖ k_s (k_s shared by the heads), the
// value v; BF16 operands, F32 accumulation and online softmax in F32, the probabilities rounded
// to BF16 for P·V (the reference's eager numerics, spec §6.4). A row's bits depend on its own
// query and its sequence's keys and values only (mla_prefill_kernels.cu says why).
struct MlaPrefillArgs {
  const float* q = nullptr;  // [rows, H, dn + dr] F32 (rounded to BF16 on load)
  const void* kv = nullptr;  // BF16 [key rows, H, dn + dv]: k_nope ‖ v per head
  const void* ks = nullptr;  // BF16 [key rows, dr] (may be null when dr = 0)
  float* o = nullptr;        // [rows, H, dv] F32
  // Device metadata (MlaPrefillPlan): seqs [B, 4] = (first q/o row, new tokens, start, first key
  // row); tiles [num_tiles, 2] = (sequence, first new token of a block of MlaPrefillTileRows()
  // of the variant).
  const int32_t* seqs = nullptr;
  const int32_t* tiles = nullptr;
  int64_t num_tiles = 0, H = 0, dn = 0, dr = 0, dv = 0;
  float scale = 1.0f;
  int variant = 0;  // the plan's (PlannedMlaPrefillArgs sets it)
};
// The widths with a kernel: the models' (dn = dv = 128; dr = 64, or 0).
bool MlaPrefillSupported(int64_t dn, int64_t dr, int64_t dv);
// Kernel shapes; every row gets the same bits from each (the same MMA and softmax steps in the
// same order: Hopper's wgmma and mma.sync give the same bits for the same operands), so the choice
// is one of speed alone:
//   0: mma.sync, 64 queries a block, 16 a warp, its query fragments in registers; key tiles
//      double-buffered (86 KB of shared memory: 2 blocks an SM);
//   1: mma.sync, 128 queries a block, 32 a warp (each K and V fragment read from shared memory
//      feeds two m-tiles), the queries in shared memory; single-buffered (92 KB: 2 blocks an SM);
//   2: Hopper's warpgroup MMA (mla_prefill_wgmma.cu; the default): 128 queries a block (two
//      warpgroups of 64), each warpgroup's query fragments in registers, the key tiles in shared
//      memory as 128-byte-swizzled panels read by descriptors, P from registers, tile j + 1's S
//      issued under tile j's softmax; 4 key tiles in flight (160 KB), 1 block an SM. 1.7-1.9x
//      variant 1 at 8K-32K on an H200, 2x variant 0 in 256-token chunks (docs/cuda.md).
// (A double-buffered 1, at 135 KB and 1 block an SM, was slower than 1 at every measured
// length and cost a third of mla_prefill_kernels.cu's compile time: dropped.)
constexpr int kMlaPrefillVariants = 3;
constexpr int kMlaPrefillDefaultVariant = 2;
int64_t MlaPrefillTileRows(int variant);
void MlaPrefillAttention(const MlaPrefillArgs& a, cudaStream_t s);
// The host side of a call's metadata: `meta` = seqs [B, 4] ‖ tiles [num_tiles, 2] (upload it and
// point MlaPrefillArgs there), the tiles with the most keys first (they finish last otherwise).
// Sequence b's keys are rows [key_begin[b], key_begin[b] + start[b] + count[b]) of kv and ks.
struct MlaPrefillPlan {
  std::vector<int32_t> meta;
  std::vector<int64_t> key_begin;
  int64_t B = 0, num_tiles = 0, keys = 0;  // keys: key rows of the whole batch
  int variant = kMlaPrefillDefaultVariant;
};
MlaPrefillPlan PlanMlaPrefill(const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                              const std::vector<int64_t>& row, int variant = kMlaPrefillDefaultVariant);
// The arguments of the call `plan` describes, its metadata uploaded to `d_meta`, at these
// widths, with the softmax scale 1/sqrt(dn + dr) (spec §6.4); q, kv, ks and o left to set.
MlaPrefillArgs PlannedMlaPrefillArgs(const MlaPrefillPlan& plan, const int32_t* d_meta, int64_t H, int64_t dn,
                                     int64_t dr, int64_t dv);
// y [n] (BF16, round to nearest even) := x [n] (F32).
void ToBf16(const float* x, void* y, int64_t n, cudaStream_t s);

// --- moe_kernels.cu (spec §7.2) ---
// Top-k of the sigmoid scores plus correction bias, (value desc, expert id asc), combine weights
// as the CPU reference gives them; a warp per token for E ≤ 1024, else MoeRouteSerial. append ≥ 0:
// idx / weights rows of k + 1, the last (append, 1) (RouteParams::append_expert).
void MoeRoute(const float* logits, const float* bias, int64_t T, int64_t E, int64_t k, bool renormalize,
              float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights, cudaStream_t s);
// The same choice one thread per token, expert by expert (the reference order; the warp kernel
// must give its bits: tests).
void MoeRouteSerial(const float* logits, const float* bias, int64_t T, int64_t E, int64_t k, bool renormalize,
                    float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights,
                    cudaStream_t s);
// A step's (token, slot) choices grouped by expert, on the device (MoeGroupByExpert fills it
// from idx [n = T·k]): order[g] = the slot at group row g (groups by expert ascending, slots
// ascending within one), pos[s] = the group row of slot s, active[a] = the a-th chosen expert
// (ascending) with its rows [begin[a], begin[a+1]), *num_active = how many. Sizes: order, pos
// [n]; active [min(E, n)]; begin [min(E, n) + 1]; num_active [1].
struct ExpertGroups {
  int32_t* order = nullptr;
  int32_t* pos = nullptr;
  int32_t* active = nullptr;
  int32_t* begin = nullptr;
  int32_t* num_active = nullptr;
};
void MoeGroupByExpert(const int32_t* idx, int64_t n, int64_t E, const ExpertGroups& g, cudaStream_t s);
// Device arrays of every expert's weight pointers (the scales' only for MXFP4).
struct ExpertPointerTable {
  const void* const* gate = nullptr;
  const void* const* up = nullptr;
  const void* const* down = nullptr;
  const uint8_t* const* gate_scales = nullptr;
  const uint8_t* const* up_scales = nullptr;
  const uint8_t* const* down_scales = nullptr;
  // BF16 weights decode-tiled (decode_tiled.cuh; CudaBackend::HoldExpertWeights): every expert's
  // gate, up and down, whose widths are then multiples of 32 rows and 128 k. MXFP4: every
  // expert's codes tiled (mxfp4_tiled.cuh; 16 rows, 128 k), the scales row-major. The decode and
  // the prefill kernels read them with the same bits; MoeGroupedExperts does not take them.
  bool tiled = false;
};
// [n, k] MXFP4 codes (n·k/2 bytes, row-major, 16-byte aligned; n % 16 == 0, k % 128 == 0) into
// `tiled`, another buffer of that size, in mxfp4_tiled.cuh's layout.
void TileMxfp4Codes(const void* codes, void* tiled, int64_t n, int64_t k, cudaStream_t s);
// The routed experts over the groups: for every group row g (slot s = order[g], token s / k,
// expert e), h[g] = GLU(W1_e z, W3_e z) ([n, I] scratch) and grouped[g] = W2_e h[g] ([n, De]).
// Each chosen expert's weights are read once for all its tokens; a token's sums have one fixed
// order (row-invariant), the same for every `format` (0 F32, 1 BF16, 2 MXFP4 codes + scales),
// so MXFP4 experts give the bits of the same experts held as BF16. max_active = min(E, n).
void MoeGroupedExperts(const float* z, int64_t k, const ExpertGroups& g, int64_t max_active, int64_t De, int64_t I,
                       const ExpertPointerTable& w, int format, int kind, float beta, bool has_linear_beta,
                       float linear_beta, float* h, float* grouped, cudaStream_t s);
// The routed experts of a decode step (T ≤ kGemvMaxRows tokens) on tensor cores, combine
// included: out[t] = Σ_j weights[t,j] · W2_e GLU(W1_e z[t], W3_e z[t]) (e = the expert of slot
// t·k + j), every chosen expert's weights read once for all its tokens, each token's sums in an
// order fixed by De, I and k alone (bit-identical alone or in any batch), the same for BF16 and
// MXFP4 weights (format 1 or 2), so packed experts give the bits of BF16-held ones. Needs
// MoeDecodeSupported (weights_aligned: every weight pointer 16-byte aligned); scales_vec (MXFP4):
// De and I multiples of 128 and every scale pointer 4-byte aligned. `scratch`: device memory of
// MoeDecodeScratchBytes(T, k, De, I) bytes, 256-byte aligned, used on stream `s` only.
bool MoeDecodeSupported(int64_t De, int64_t I, int format, bool weights_aligned);
size_t MoeDecodeScratchBytes(int64_t T, int64_t k, int64_t De, int64_t I);
// Slices the k of gate/up (or down) is split across (1 = none); for tests and benches.
int64_t MoeDecodeSplits(int64_t De, int64_t I, int64_t k, bool gate_up);
// Token tiles an expert kernel pass covers (1, 2 or 4; a group of more tokens takes more passes,
// each a re-read of its weights; the count changes no token's sums), of 8 tokens, or of 2 with
// part_columns (MoeDecodeExperts). E = 0: by T alone (T <= 8: 1, <= 16: 2, else 4 tiles of 8: one
// pass covers any expert up to 32 tokens; of 2: T <= 2, <= 4). E > 0 routed experts, k picks a
// token, none taking every token (no shared expert appended): enough for 4x the mean group T·k/E
// (part columns: for the mean group), at most T's count, since the 2- and 4-tile kernels'
// registers cost every block occupancy while few groups are that large (K3, 16 of 896: a mean of
// 0.6 tokens at T = 32).
int MoeDecodeTokenTiles(int64_t T, int64_t k, int64_t E, bool part_columns);
// z_split_done: `scratch` already holds z's split (MoeRouteGroupSplit wrote it); z is not read.
// token_tiles: MoeDecodeTokenTiles's count (0: by T). part_columns: a tile's 8 MMA columns hold 2
// tokens' three x parts (moe_kernels.cu kPartCols; for a light routed load, ExpertWeights::
// light_load, with no shared expert riding), else 8 tokens; another order of the same sums, fixed
// for the launch's configuration, so it may not change with T.
void MoeDecodeExperts(const float* z, int64_t T, int64_t k, const ExpertGroups& g, int64_t max_active, int64_t De,
                      int64_t I, const ExpertPointerTable& w, int format, bool scales_vec, int kind, float beta,
                      bool has_linear_beta, float linear_beta, const float* weights, void* scratch, float* out,
                      cudaStream_t s, bool z_split_done = false, int token_tiles = 0, bool part_columns = false);
// MoeRoute (append ≥ 0: expert `append` after each token's k), MoeGroupByExpert of its choice
// over E_group experts into g, and MoeDecodeExperts's split of z [T, De] into `decode_scratch`
// (its scratch for T tokens, k + 1 or k slots, De), as one launch: a decode step's route chain
// (MoeDecodeExperts then runs with z_split_done). The same idx, weights, groups and split as the
// three calls, bit for bit. Needs MoeRouteGroupSplitSupported.
bool MoeRouteGroupSplitSupported(int64_t T, int64_t E, int64_t k, int64_t E_group);
void MoeRouteGroupSplit(const float* logits, const float* bias, int64_t T, int64_t E, int64_t k, bool renormalize,
                        float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights,
                        int64_t E_group, const ExpertGroups& g, const float* z, int64_t De, void* decode_scratch,
                        cudaStream_t s);
// MoeRouteGroupSplit's calls in this process so far (tests: which path a call took; a captured
// graph's replays are not counted).
uint64_t MoeRouteGroupSplitLaunches();
// --- moe_prefill_kernels.cu: the routed experts of a prefill call on tensor cores ---
// What MoeGroupedExperts computes, for calls of more than kGemvMaxRows tokens with
// Backend::bf16_prefill on: for every group row g (slot order[g], token order[g] / k, expert e),
// h[g] = bf16(GLU(bf16(z) W1_eᵀ, bf16(z) W3_eᵀ)) and grouped[g] = h[g] W2_eᵀ, BF16 tensor cores with
// F32 accumulation, weights BF16 (mxfp4 false) or MXFP4 codes + scales decoded to BF16 in the
// kernel — the same bits either way. A token's bits depend on its own row only. The tile
// schedule is built on the device from the groups (no host round trip). Needs De and I multiples
// of 8 (32 for MXFP4: MoePrefillSupports); `scratch` is device memory of
// MoePrefillScratchBytes(T, k, De, I, max_active) bytes, 256-byte aligned.
bool MoePrefillSupports(int64_t De, int64_t I, bool mxfp4);
size_t MoePrefillScratchBytes(int64_t T, int64_t k, int64_t De, int64_t I, int64_t max_active);
void MoePrefillExperts(const float* z, int64_t T, int64_t k, const ExpertGroups& g, int64_t max_active, int64_t De,
                       int64_t I, const ExpertPointerTable& w, bool mxfp4, int kind, float beta, bool has_linear_beta,
                       float linear_beta, void* scratch, float* grouped, cudaStream_t s);
// out[i] = the MXFP4 value i of `codes` / `scales` (n a multiple of 32), decoded as the expert
// kernels decode it (for the bit-for-bit check against core/dtype_convert).
void DequantizeMxfp4(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out, cudaStream_t s);
// out[t] = Σ_j weights[t,j] · grouped[pos[t·k + j]], j ascending.
void MoeCombine(const float* grouped, const int32_t* pos, const float* weights, int64_t T, int64_t k, int64_t D,
                float* out, cudaStream_t s);

// --- kv_cache_kernels.cu (backend.h KvStorage) ---
// kind: 0 F32, 1 BF16, 2 FP8 E4M3 with per-token per-part scales [.., 2].
void KvWrite(const float* c, const float* ks, int64_t T, int64_t r, int64_t dr, const int32_t* table, int64_t pos,
             int layers, int layer, int block_size, int kind, void* values, float* scales, cudaStream_t s);
// Row b of c [B, r], ks [B, dr] to position context[b] - 1 of the block table
// tables[table_begin[b] ..) (PagedDecodeArgs' metadata).
void KvWriteDecode(const float* c, const float* ks, int64_t B, int64_t r, int64_t dr, const int32_t* context,
                   const int32_t* table_begin, const int32_t* tables, int layers, int layer, int block_size, int kind,
                   void* values, float* scales, cudaStream_t s);
// Positions [first, len) of the block table to rows [0, len - first) of c [.., r] and ks [.., dr],
// widened to F32.
void KvGather(const void* values, const float* scales, int64_t first, int64_t len, int64_t r, int64_t dr,
              const int32_t* table, int layers, int layer, int block_size, int kind, float* c, float* ks,
              cudaStream_t s);

// Element i of a weight array held as F32 or BF16 (a uniform branch in every kernel using it).
#ifdef __CUDACC__
__device__ inline float WeightAt(const void* w, int64_t i, bool bf16) {
  if (bf16) return __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short*>(w)[i]) << 16);
  return static_cast<const float*>(w)[i];
}
// Elements i .. i + 7 of the same (i a multiple of 8, the array 16-byte aligned): one or two
// 16-byte loads.
__device__ inline void Weights8At(const void* w, int64_t i, bool bf16, float (&out)[8]) {
  if (bf16) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(w) + i);
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) out[2 * k] = __uint_as_float(u[k] << 16), out[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
  } else {
    const float4 x = *reinterpret_cast<const float4*>(static_cast<const float*>(w) + i);
    const float4 y = *reinterpret_cast<const float4*>(static_cast<const float*>(w) + i + 4);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w, out[4] = y.x, out[5] = y.y, out[6] = y.z, out[7] = y.w;
  }
}
#endif

// Aborts with the kernel's name when the thread has an unread CUDA error after a launch: the
// launch's own (a bad configuration is a programmer error) or one an earlier call left.
void CheckLaunch(const char* what);

}  // namespace kimirt::cuda
