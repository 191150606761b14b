// CudaBackend (cuda_backend.h): memory, transfers, cuBLAS GEMMs, and the dispatch of each op
// to its kernel (kernels.h).
#include "kimirt/backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kimirt/backend/cuda/env_switch.h"
#include "kimirt/backend/expanded_history.h"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/mxfp4_tiled.cuh"

namespace kimirt {
namespace {

// A failed CUDA call after start-up means a bad argument or a broken device: stop loudly.
#define KIMIRT_CUDA_OK(expr)                                                                          \
  do {                                                                                                \
    const cudaError_t kimirt_e = (expr);                                                              \
    if (kimirt_e != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "kimirt: %s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(kimirt_e), __FILE__, \
                   __LINE__);                                                                         \
      std::abort();                                                                                   \
    }                                                                                                 \
  } while (0)

#define KIMIRT_CUBLAS_OK(expr)                                                                  \
  do {                                                                                          \
    const cublasStatus_t kimirt_s = (expr);                                                     \
    if (kimirt_s != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "kimirt: %s failed: cuBLAS status %d (%s:%d)\n", #expr, static_cast<int>(kimirt_s), \
                   __FILE__, __LINE__);                                                         \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

// Size classes: 512 bytes, then steps of a quarter of the power of two below (at most 25% waste),
// so a buffer that grows by a row per decode step reuses the same block most of the time. From
// 1 GiB (in practice the latent cache, one block sized by SizeFromGpuMemory to the memory left
// after the weights) the driver's 2 MiB pages instead: a quarter-power step there is up to 16 GiB,
// which could round the cache past what is free.
constexpr size_t kPageClassFrom = size_t{1} << 30, kDriverPage = size_t{2} << 20;
size_t SizeClass(size_t bytes) {
  if (bytes >= kPageClassFrom) return (bytes + kDriverPage - 1) / kDriverPage * kDriverPage;
  if (bytes <= 512) return 512;
  size_t p = 1;
  while (p * 2 <= bytes) p *= 2;
  const size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

// A caching pool of device blocks. Blocks are handed out and returned on the backend's one
// stream, in issue order, so a returned block can be reused at once (like PyTorch's caching
// allocator on a single stream). Shared with every tensor's deleter, so it outlives them.
class DevicePool {
 public:
  explicit DevicePool(int device) : device_(device) {}
  ~DevicePool() {
    for (auto& [size, p] : free_) cudaFree(p);  // errors at exit are of no use to anyone
  }
  void* Get(size_t bytes) {
    const size_t cls = SizeClass(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        return p;
      }
    }
    void* p = nullptr;
    KIMIRT_CUDA_OK(cudaSetDevice(device_));
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) {
      // Out of memory: give the cached blocks back to the driver and try once more.
      (void)cudaGetLastError();
      Trim();
      e = cudaMalloc(&p, cls);
    }
    KIMIRT_CUDA_OK(e);
    return p;
  }
  void Put(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(SizeClass(bytes), p);
  }
  void Trim() {
    std::lock_guard<std::mutex> lock(mu_);
    KIMIRT_CUDA_OK(cudaDeviceSynchronize());
    for (auto& [size, p] : free_) cudaFree(p);
    free_.clear();
  }

 private:
  int device_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
};

// A model's weights packed into slabs (Backend::BeginWeights; off with KIMIRT_WEIGHT_SLABS=0): the
// caching pool rounds a block up to its size class, up to a quarter more (a Kimi-Linear expert
// matrix of 4.5 MiB takes 5 MiB: ~9.8 GiB over the whole 48B's tensor bytes; K3's TP-8 expert
// codes of 672 KiB take 768 KiB), and the driver maps large allocations in 2 MiB pages. Here a
// weight under kSlabTensorBytes is placed at the next 256-byte boundary of a kSlabBytes slab (a
// new slab when it does not fit: at most one such tensor's bytes lost a slab) and a larger one
// gets an allocation of its own; weights are never freed one by one, only with their model, so
// no slab space is ever handed out again. Each tensor shares ownership of its slab (an aliasing
// shared_ptr), which is freed with the last of them.
class WeightSlabs {
 public:
  static constexpr size_t kSlabBytes = size_t{128} << 20;
  static constexpr size_t kSlabTensorBytes = size_t{8} << 20;
  static constexpr size_t kAlign = 256;

  explicit WeightSlabs(int device) : device_(device) {}
  std::shared_ptr<void> Get(size_t bytes) {
    const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    if (need >= kSlabTensorBytes) return Allocate(need);
    std::lock_guard<std::mutex> lock(mu_);
    if (slab_ == nullptr || used_ + need > kSlabBytes) {
      slab_ = Allocate(kSlabBytes);
      used_ = 0;
    }
    void* p = static_cast<char*>(slab_.get()) + used_;
    used_ += need;
    return std::shared_ptr<void>(slab_, p);
  }
  // The last slab goes with its tensors from now on (EndWeights).
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    slab_.reset();
    used_ = 0;
  }

 private:
  std::shared_ptr<void> Allocate(size_t bytes) {
    void* p = nullptr;
    KIMIRT_CUDA_OK(cudaSetDevice(device_));
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "kimirt: allocating %.3f GiB of weights on device %d failed: %s\n",
                   static_cast<double>(bytes) / (1 << 30), device_, cudaGetErrorString(e));
      std::abort();
    }
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }

  int device_;
  std::mutex mu_;
  std::shared_ptr<void> slab_;
  size_t used_ = 0;
};

class CudaBackend;

// The latent cache's rows on the GPU (backend.h KvStorage): one device buffer of
// [blocks, layers, block_size, r + dr] codes, plus the FP8 scales [.., 2].
class CudaKvStorage final : public KvStorage {
 public:
  CudaKvStorage(CudaBackend& be, const KvStorageShape& s) : be_(be), s_(s), w_(s.latent_dim + s.rope_dim) {
    kind_ = s.dtype == DType::kF32 ? 0 : s.dtype == DType::kBF16 ? 1 : 2;
    KIMIRT_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16 || s.dtype == DType::kF8E4M3);
  }
  void Resize(int64_t blocks) override;
  void Write(int layer, std::span<const int32_t> table, int64_t pos, const Tensor& c, const Tensor& ks) override;
  void Gather(int layer, std::span<const int32_t> table, int64_t len, Tensor* c, Tensor* ks) override;
  void SetDecodeStep(const PagedDecodeStep& step) override;
  void WriteDecode(int layer, const Tensor& c, const Tensor& ks) override;
  void AttendDecode(int layer, const Tensor& q, const Tensor& w_kvb, const MlaShape& shape, Tensor* o) override;
  std::string GraphKey() const override;
  void AttendPrefill(int layer, const PagedPrefill& batch, const Tensor& q, const Tensor& w_kvb,
                     const MlaShape& shape, Tensor* o) override;
  void Released(std::span<const int32_t> blocks) override;

 private:
  // The step's metadata on the device, one int32 array uploaded once per step into a buffer
  // that only grows (so graphs can bake its address): work count ‖ context [B] ‖ table_begin
  // [B + 1] ‖ split_begin [B + 1] ‖ work [work capacity, 3] ‖ tables [table capacity] ‖
  // block_work [SmCount() + 1]. The capacities are powers of two, so the layout (and a graph's
  // launch shapes) change rarely.
  cuda::PagedDecodeArgs StepArgs(int layer) const;
  Tensor step_meta_;
  int64_t step_b_ = 0, step_work_cap_ = 0, step_tables_cap_ = 0;

  CudaBackend& be_;
  KvStorageShape s_;
  int64_t w_;
  int kind_ = 0;
  int64_t blocks_ = 0;
  Tensor values_, scales_;

  // A prefilling sequence's expanded history kept between its chunks (expanded_history.h): per
  // (entry, layer) k_nope ‖ v [capacity, H·(dn + dv)] and k_s [capacity, dr] in BF16, the very
  // rows the attention reads. Made at the first AttendPrefill (the row width comes with it).
  struct HistoryBuffer {
    Tensor kv, ks;
    int64_t capacity = 0;
  };
  ExpandedHistory* History(int64_t width, int64_t dr);
  void Free(const ExpandedHistory::Dropped& dropped);
  std::optional<ExpandedHistory> history_;
  int64_t history_width_ = 0, history_dr_ = 0;
  std::vector<std::vector<HistoryBuffer>> history_buffers_;  // [entry][layer]
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream, cublasHandle_t blas)
      : device_(device), stream_(stream), blas_(blas), pool_(std::make_shared<DevicePool>(device)) {}
  ~CudaBackend() override {
    CaptureAbandon();  // else the stream, still capturing, refuses the calls below
    cudaStreamSynchronize(stream_);
    if (prefetch_stream_ != nullptr) {
      cudaStreamSynchronize(prefetch_stream_);
      cudaStreamDestroy(prefetch_stream_);
      cudaEventDestroy(prefetch_fork_);
      cudaEventDestroy(prefetch_join_);
    }
    for (auto& [key, g] : graphs_) DestroyGraph(g);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
    // A failure here (a device a dead peer left in error) is not the next backend's: it must not
    // surface in an unrelated CheckLaunch of this thread.
    (void)cudaGetLastError();
  }

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  cudaStream_t stream() const { return stream_; }

  // No fill: a forward allocates a few hundred outputs, each fully written by its op, and a
  // memset apiece was a measurable share of the launches of a decode step.
  Tensor Empty(Shape shape, DType dtype) override { return Raw(std::move(shape), dtype); }
  Tensor Zeros(Shape shape, DType dtype) override {
    Tensor t = Raw(std::move(shape), dtype);
    if (t.nbytes() > 0) KIMIRT_CUDA_OK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), stream_));
    return t;
  }

  Tensor Upload(const Tensor& host) override {
    if (host.device() == Device::kCuda) return host;
    Tensor t = Raw(host.shape(), host.dtype());
    // From pageable memory the copy is staged before the call returns, so `host` may go.
    if (t.nbytes() > 0) {
      KIMIRT_CUDA_OK(cudaMemcpyAsync(t.raw(), host.raw(), t.nbytes(), cudaMemcpyHostToDevice, stream_));
    }
    return t;
  }

  Tensor Download(const Tensor& t) override {
    if (t.device() == Device::kCpu) return t;
    NotCapturing("a download");
    Tensor h = Tensor::Host(t.shape(), t.dtype());
    if (t.nbytes() > 0) {
      KIMIRT_CUDA_OK(cudaMemcpyAsync(h.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    }
    Synchronize();
    return h;
  }

  std::vector<int32_t> ArgmaxRows(const Tensor& logits) override {
    KIMIRT_CHECK(logits.rank() == 2 && logits.dtype() == DType::kF32 && logits.device() == Device::kCuda);
    const int64_t R = logits.dim(0);
    std::vector<int32_t> ids(static_cast<size_t>(R));
    if (R == 0) return ids;
    Tensor scratch = Empty({static_cast<int64_t>(cuda::ArgmaxRowsScratchBytes(R))}, DType::kU8);
    Tensor dev_ids = Empty({R}, DType::kI32);
    cuda::ArgmaxRows(F(logits), R, logits.dim(1), scratch.raw(), static_cast<int32_t*>(dev_ids.raw()), stream_);
    Tensor host = Download(dev_ids);
    std::copy_n(static_cast<const int32_t*>(host.raw()), R, ids.data());
    return ids;
  }

  int64_t RowInvariantRows() const override { return cuda::kGemvMaxRows; }

  bool SupportsGraphs() const override { return true; }
  bool HasGraph(const std::string& key) const override { return graphs_.count(StoredKey(key)) > 0; }

  void CaptureBegin(const std::string& key) override {
    NotCapturing("a second capture");
    capture_pool_ = std::make_shared<DevicePool>(device_);
    capture_key_ = key;
    capture_slot_bound_ = false;
    // Relaxed: the graph's pool may cudaMalloc its first blocks while capturing.
    KIMIRT_CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  }

  bool CaptureEnd(const Tensor& output) override {
    KIMIRT_CHECK_MSG(capture_pool_ != nullptr, "CaptureEnd without CaptureBegin");
    JoinPrefetches();
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    Graph g;
    g.pool = std::move(capture_pool_);
    capture_pool_.reset();
    if (e == cudaSuccess) {
      e = cudaGraphInstantiate(&g.exec, graph, 0);
      cudaGraphDestroy(graph);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "kimirt: capturing the decode graph %s failed (%s); running eagerly\n",
                   capture_key_.c_str(), cudaGetErrorString(e));
      return false;
    }
    g.output = output;
    g.last_use = ++graph_tick_;
    if (capture_slot_bound_) slot_bound_keys_.insert(capture_key_);
    capture_key_ = StoredKey(capture_key_);
    if (auto it = graphs_.find(capture_key_); it != graphs_.end()) EraseGraph(it);
    if (graphs_.size() >= kMaxGraphs) {
      auto lru = graphs_.begin();
      for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
        if (it->second.last_use < lru->second.last_use) lru = it;
      }
      EraseGraph(lru);
    }
    graphs_.emplace(capture_key_, std::move(g));
    return true;
  }

  void CaptureAbandon() override {
    if (!capture_pool_) return;
    JoinPrefetches(/*checked=*/false);
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    capture_pool_.reset();
    (void)cudaGetLastError();
  }

  Tensor Replay(const std::string& key) override {
    auto it = graphs_.find(StoredKey(key));
    KIMIRT_CHECK_MSG(it != graphs_.end(), "Replay of a decode graph never captured");
    it->second.last_use = ++graph_tick_;
    KIMIRT_CUDA_OK(cudaGraphLaunch(it->second.exec, stream_));
    return it->second.output;
  }

  void DropGraph(const std::string& key) override {
    NotCapturing("DropGraph");
    if (auto it = graphs_.find(StoredKey(key)); it != graphs_.end()) EraseGraph(it);
  }

  void SetDecodeInputs(std::span<const int32_t> ids, std::span<const int32_t> slots) override {
    NotCapturing("SetDecodeInputs");
    auto put = [&](std::span<const int32_t> v, Tensor* dev, std::vector<int32_t>* host) {
      host->clear();
      if (static_cast<int64_t>(v.size()) > kDecodeInputCap) return;
      if (dev->raw() == nullptr) *dev = Raw({kDecodeInputCap}, DType::kI32);  // a default Tensor has rank 0
      if (!v.empty()) CopyToDevice(dev->raw(), v.data(), v.size() * sizeof(int32_t));
      host->assign(v.begin(), v.end());
    };
    put(ids, &decode_ids_, &decode_ids_host_);
    put(slots, &decode_slots_, &decode_slots_host_);
  }

  // Weights into slabs while a model loads (WeightSlabs); KIMIRT_WEIGHT_SLABS=0 gives them the
  // caching pool's blocks instead. Measured on an H100 (bench model's device_bytes_loading_took,
  // gpu_check.sh slabs): the 48B's first 16 layers took 75.9 GB of the GPU from the pool against
  // 58.4 GB in slabs (57.4 planned), the same decode step either way.
  void BeginWeights() override {
    // Read at each load, so a test can set it.
    if (cuda::EnvSwitchOn("KIMIRT_WEIGHT_SLABS")) weight_slabs_ = std::make_unique<WeightSlabs>(device_);
  }
  void EndWeights() override {
    if (weight_slabs_ != nullptr) weight_slabs_->Close();
    weight_slabs_.reset();
  }

  std::optional<MemoryInfo> DeviceMemory() override {
    size_t free = 0, total = 0;
    KIMIRT_CUDA_OK(cudaSetDevice(device_));
    KIMIRT_CUDA_OK(cudaMemGetInfo(&free, &total));
    return MemoryInfo{free, total};
  }

  std::unique_ptr<KvStorage> MakeKvStorage(const KvStorageShape& shape) override {
    return std::make_unique<CudaKvStorage>(*this, shape);
  }

  void CopyColumns(const Tensor& x, int64_t begin, int64_t count, Tensor* y) override {
    const int64_t T = Rows(x), C = Cols(x);
    KIMIRT_CHECK(begin >= 0 && begin + count <= C && Rows(*y) == T && Cols(*y) == count);
    cuda::CopyColumns(F(x), T, C, begin, count, F(*y), stream_);
  }

  void CopyColumnsTo(const Tensor& x, int64_t begin, Tensor* y) override {
    const int64_t T = Rows(x), C = Cols(x), N = Cols(*y);
    KIMIRT_CHECK(begin >= 0 && begin + C <= N && Rows(*y) == T);
    if (T == 0 || C == 0) return;
    KIMIRT_CUDA_OK(cudaMemcpy2DAsync(F(*y) + begin, static_cast<size_t>(N) * sizeof(float), F(x),
                                 static_cast<size_t>(C) * sizeof(float), static_cast<size_t>(C) * sizeof(float),
                                 static_cast<size_t>(T), cudaMemcpyDeviceToDevice, stream_));
  }

  void Linear(const Tensor& x, const Tensor& w, Tensor* y) override {
    const int64_t T = Rows(x), K = Cols(x), N = Rows(w);
    KIMIRT_CHECK_MSG(Cols(w) == K && Rows(*y) == T && Cols(*y) == N, "Linear shapes");
    GemmW(F(x), w, F(*y), T, N, K);
  }

  // A decode group (every weight BF16-held, 1..kGemvMaxRows rows) in one DecodeGemmGroup: each y
  // the bits of its own DecodeGemm; anything else as Linear in turn. KIMIRT_LINEAR_GROUP=0 runs
  // every group as Linear in turn (the same bits), for A/B runs of a whole step.
  void LinearGroup(std::span<const LinearProblem> problems) override {
    if (problems.empty()) return;
    static const bool enabled = cuda::EnvSwitchOn("KIMIRT_LINEAR_GROUP");
    const int64_t T = Rows(*problems[0].x);
    bool grouped = enabled && T >= 1 && T <= cuda::kGemvMaxRows && problems.size() > 1;
    std::vector<cuda::DecodeGemmProblem> dp;
    for (const LinearProblem& p : problems) {
      const int64_t K = Cols(*p.x), N = Rows(*p.w);
      KIMIRT_CHECK_MSG(Cols(*p.w) == K && Rows(*p.y) == Rows(*p.x) && Cols(*p.y) == N, "LinearGroup shapes");
      W(*p.w);  // an F32 or BF16 device weight, or a clear error
      grouped = grouped && Rows(*p.x) == T && K > 0 && p.w->dtype() == DType::kBF16;
      if (grouped) dp.push_back({F(*p.x), p.w->raw(), F(*p.y), N, K, Tiled(p.w->raw())});
    }
    if (!grouped) {
      Backend::LinearGroup(problems);
      return;
    }
    const int count = static_cast<int>(dp.size());
    Tensor scratch = Scratch(cuda::DecodeGemmGroupScratchBytes(T, dp.data(), count));
    cuda::DecodeGemmGroup(T, dp.data(), count, scratch.raw(), stream_);
  }

  // The weights in order, up to L2PrefetchBudget() bytes in all (the L2 holds ~50 MB; asking for
  // more evicts the first ones before their GEMM reads them), as one PrefetchL2 launch.
  void PrefetchWeights(std::span<const Tensor* const> weights) override {
    int64_t left = L2PrefetchBudget();
    std::vector<cuda::L2Range> ranges;
    for (const Tensor* w : weights) {
      if (left <= 0 || ranges.size() == cuda::kMaxL2Ranges) break;
      if (w == nullptr || !w->defined() || w->device() != Device::kCuda || w->nbytes() == 0) continue;
      const int64_t bytes = std::min(static_cast<int64_t>(w->nbytes()), left);
      ranges.push_back({w->raw(), bytes});
      left -= bytes;
    }
    if (ranges.empty()) return;
    // Beside the chain (l2_prefetch.cu says why): forked off after the work enqueued so far.
    if (prefetch_stream_ == nullptr) {
      KIMIRT_CUDA_OK(cudaStreamCreateWithFlags(&prefetch_stream_, cudaStreamNonBlocking));
      KIMIRT_CUDA_OK(cudaEventCreateWithFlags(&prefetch_fork_, cudaEventDisableTiming));
      KIMIRT_CUDA_OK(cudaEventCreateWithFlags(&prefetch_join_, cudaEventDisableTiming));
    }
    KIMIRT_CUDA_OK(cudaEventRecord(prefetch_fork_, stream_));
    KIMIRT_CUDA_OK(cudaStreamWaitEvent(prefetch_stream_, prefetch_fork_, 0));
    cuda::PrefetchL2Ranges(ranges.data(), static_cast<int>(ranges.size()), prefetch_stream_);
    prefetch_forked_ = true;
  }
  // The prefetch stream joined back into the main one: a capture must end on one stream.
  // `checked` false: an abandoned capture's join, which an invalidated capture may refuse.
  void JoinPrefetches(bool checked = true) {
    if (!prefetch_forked_) return;
    const cudaError_t join_record = cudaEventRecord(prefetch_join_, prefetch_stream_);
    const cudaError_t join_wait = cudaStreamWaitEvent(stream_, prefetch_join_, 0);
    if (checked) {
      KIMIRT_CUDA_OK(join_record);
      KIMIRT_CUDA_OK(join_wait);
    }
    prefetch_forked_ = false;
  }
  // KIMIRT_L2_PREFETCH_MB: the bytes one PrefetchWeights call may ask for (0: none). 16 MB: the
  // whole 48B's batch-1 step 2.83 ms against 2.93 with none, 2.86 with 32 MB and 2.87 with 48
  // (one H200, interleaved runs, bench/results "l2-prefetch"); the 2-layer model is unchanged.
  static int64_t L2PrefetchBudget() {
    static const int64_t mb = [] {
      const char* v = std::getenv("KIMIRT_L2_PREFETCH_MB");
      return v == nullptr ? int64_t{16} : std::max<int64_t>(0, std::atoll(v));
    }();
    return mb << 20;
  }

  void RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor* y) override {
    KIMIRT_CHECK(w.numel() == Cols(x) && y->numel() == x.numel());
    cuda::RmsNorm(F(x), F(w), eps, Rows(x), Cols(x), F(*y), stream_);
  }

  void AddRmsNorm(const Tensor& a, const Tensor& b, const Tensor& w, float eps, Tensor* h, Tensor* y) override {
    KIMIRT_CHECK(a.numel() == b.numel() && a.numel() == h->numel() && a.numel() == y->numel() &&
                 w.numel() == Cols(a));
    KIMIRT_CHECK_MSG(h->raw() != a.raw() && h->raw() != b.raw() && y->raw() != a.raw() && y->raw() != b.raw() &&
                         y->raw() != h->raw(),
                     "AddRmsNorm: h and y must be new tensors");
    cuda::AddRmsNorm(F(a), F(b), F(w), eps, Rows(a), Cols(a), F(*h), F(*y), stream_);
  }

  void Add(const Tensor& a, const Tensor& b, Tensor* y) override {
    KIMIRT_CHECK(a.numel() == b.numel() && a.numel() == y->numel());
    cuda::Add(F(a), F(b), F(*y), a.numel(), stream_);
  }

  void SigmoidMul(const Tensor& x, const Tensor& g, Tensor* y) override {
    KIMIRT_CHECK(x.numel() == g.numel() && x.numel() == y->numel());
    cuda::SigmoidMul(F(x), F(g), F(*y), x.numel(), stream_);
  }

  void Glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor* y) override {
    KIMIRT_CHECK(gate.numel() == up.numel() && gate.numel() == y->numel());
    GluRaw(F(gate), F(up), F(*y), gate.numel(), p);
  }

  void Embedding(std::span<const int32_t> ids, const Tensor& table, int64_t row_begin, Tensor* y) override {
    const int64_t T = static_cast<int64_t>(ids.size());
    KIMIRT_CHECK(Rows(*y) == T && Cols(*y) == Cols(table));
    Tensor tmp;
    cuda::Embedding(DecodeInput(ids, decode_ids_host_, decode_ids_, &tmp), T, W(table), table.dtype() == DType::kBF16, Rows(table),
                    Cols(table), row_begin, F(*y), stream_);
  }

  // A row over a cluster of blocks (cuda::AttnResMixCluster, up to 8,192 wide) from
  // cuda::kAttnResClusterFromCandidates candidates on, below that the held kernels (one block a
  // row): the count is the layer's (spec §4.1), so a row's bits never depend on the batch.
  // KIMIRT_ATTNRES_CLUSTER=1 / 0 takes the cluster always / never, for A/B runs.
  static bool AttnResCluster(int64_t D, size_t candidates) {
    static const cuda::EnvForce force = cuda::EnvForced("KIMIRT_ATTNRES_CLUSTER");
    const bool by_count = candidates >= static_cast<size_t>(cuda::kAttnResClusterFromCandidates);
    const bool on = force == cuda::EnvForce::kOn || (force == cuda::EnvForce::kAuto && by_count);
    return on && cuda::AttnResMixClusterSupported(D);
  }

  void AttnResMix(std::span<const Tensor* const> cands, const Tensor& proj, const Tensor& norm_w, float eps,
                  Tensor* y) override {
    const int64_t T = Rows(*cands[0]), D = Cols(*cands[0]);
    if (AttnResCluster(D, cands.size())) {
      return cuda::AttnResMixCluster(Candidates(cands), F(proj), F(norm_w), eps, nullptr, 0.0f, T, D, F(*y), stream_);
    }
    cuda::AttnResMix(Candidates(cands), F(proj), F(norm_w), eps, T, D, F(*y), stream_);
  }

  // The mix and its norm in one kernel: the kernel tracer charged the norm after each mix ~8 µs
  // at K3's width, 4 of a 2-layer step's. Held (one block a row, the default): the bits of the
  // mix and the norm kernels; KIMIRT_ATTNRES_MIX_NORM=0 runs those two, for A/B runs.
  void AttnResMixNorm(std::span<const Tensor* const> cands, const Tensor& proj, const Tensor& norm_w, float eps,
                      const Tensor& out_w, float out_eps, Tensor* y) override {
    static const bool fused = cuda::EnvSwitchOn("KIMIRT_ATTNRES_MIX_NORM");
    const int64_t T = Rows(*cands[0]), D = Cols(*y);
    KIMIRT_CHECK(out_w.numel() == D);
    if (fused && AttnResCluster(D, cands.size())) {
      return cuda::AttnResMixCluster(Candidates(cands), F(proj), F(norm_w), eps, F(out_w), out_eps, T, D, F(*y),
                                     stream_);
    }
    if (!fused || !cuda::AttnResMixNormSupported(D)) {
      return Backend::AttnResMixNorm(cands, proj, norm_w, eps, out_w, out_eps, y);
    }
    cuda::AttnResMixNorm(Candidates(cands), F(proj), F(norm_w), eps, F(out_w), out_eps, T, D, F(*y), stream_);
  }

  void CausalConvSilu(const Tensor& x, const Tensor& w, Tensor* window, Tensor* y) override {
    cuda::CausalConvSilu(F(x), Rows(x), Cols(x), F(w), Cols(w), F(*window), F(*y), stream_);
  }

  void KdaLogDecay(const Tensor& f, const Tensor& a_log, const Tensor& dt_bias, std::optional<float> lower_bound,
                   Tensor* alpha) override {
    const int64_t H = a_log.numel(), K = dt_bias.numel() / H;
    cuda::KdaLogDecay(F(f), Rows(f), H, K, F(a_log), F(dt_bias), lower_bound.has_value(), lower_bound.value_or(0.0f),
                      F(*alpha), stream_);
  }

  void KdaCore(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta_logits, const Tensor& alpha,
               int64_t heads, KdaForm form, Tensor* state, Tensor* o) override {
    // Both forms compute the same function (spec §5.5). The chunked one runs on tensor cores
    // (kda_chunk_kernels.cu) at head dim 128 (rows 16-byte aligned, as every row view of a
    // pooled tensor is): F32 math in F32 mode; in the BF16 prefill mode the chunk-parallel
    // kernels, BF16 operands, their per-chunk records in scratch (72.5 KB per 64 tokens and
    // head: 36 MB for a 256-token prefill chunk at 96 heads, 235 MB at 2048 tokens;
    // docs/cuda.md "Chunked KDA prefill"); otherwise recurrently.
    const int64_t T = Rows(q);
    auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0; };
    if (form == KdaForm::kChunked && T > 0 && heads > 0 && Cols(q) == heads * cuda::kKdaChunkHeadDim &&
        aligned(q) && aligned(k) && aligned(v) && aligned(alpha) && aligned(*o)) {
      cuda::KdaChunkArgs a;  // one sequence, its state the pool's only slot: no metadata to upload
      a.q = F(q), a.k = F(k), a.v = F(v), a.beta_logits = F(beta_logits), a.alpha = F(alpha);
      a.state = F(*state), a.o = F(*o);
      a.batch = 1, a.tokens = T, a.heads = heads, a.head_dim = cuda::kKdaChunkHeadDim;
      Tensor scratch;
      if (bf16_prefill()) {
        scratch = Scratch(cuda::KdaChunkScratchBytes(T, 1, heads));
        a.scratch = scratch.raw();
      }
      cuda::KdaChunked(a, stream_, bf16_prefill());
      return;
    }
    cuda::KdaRecurrent(F(q), F(k), F(v), F(beta_logits), F(alpha), Rows(q), heads, Cols(q) / heads, F(*state),
                       F(*o), stream_);
  }

  void GatedRmsNorm(const Tensor& x, const Tensor& g, const Tensor& w, float eps, Tensor* y) override {
    const int64_t K = w.numel();
    cuda::GatedRmsNorm(F(x), F(g), F(w), eps, x.numel() / K, K, F(*y), stream_);
  }

  // The fused kernel (kda_decode_kernels.cu) where it applies (head dim 128, up to 4 taps, F32
  // taps); otherwise the base version's per-op kernels. The slots go up in one small copy.
  void KdaDecode(std::span<const int32_t> slots, const Tensor& q_raw, const Tensor& k_raw, const Tensor& v_raw,
                 const Tensor& f, const Tensor& beta_logits, const Tensor& gate, const KdaDecodeWeights& w,
                 KdaStatePool* pool, Tensor* o) override {
    const int64_t B = Rows(q_raw), Pl = Cols(q_raw), H = w.a_log->numel(), W = Cols(*w.conv_q);
    if (B == 0 || B > 65535 || H == 0 || Pl != H * cuda::kKdaDecodeHeadDim || W < 1 || W > 4 ||
        w.conv_q->dtype() != DType::kF32) {
      // Per-row ops on slot views: a graph of them bakes the slots' addresses in.
      capture_slot_bound_ = true;
      Backend::KdaDecode(slots, q_raw, k_raw, v_raw, f, beta_logits, gate, w, pool, o);
      return;
    }
    KIMIRT_CHECK(static_cast<int64_t>(slots.size()) == B && pool->conv_q.dim(1) == W - 1);
    CheckDecodeSlots(slots, pool->recurrent.dim(0));
    Tensor tmp;
    const int32_t* d_slots = DecodeInput(slots, decode_slots_host_, decode_slots_, &tmp);
    KdaDecodeArgs a;
    a.rows = B;
    a.heads = H;
    a.head_dim = cuda::kKdaDecodeHeadDim;
    a.conv_taps = W;
    a.q = F(q_raw);
    a.k = F(k_raw);
    a.v = F(v_raw);
    a.beta_logits = F(beta_logits);
    a.f = F(f);
    a.gate = F(gate);
    a.conv_q = F(*w.conv_q);
    a.conv_k = F(*w.conv_k);
    a.conv_v = F(*w.conv_v);
    a.a_log = F(*w.a_log);
    a.dt_bias = F(*w.dt_bias);
    a.o_norm = F(*w.o_norm);
    a.norm_eps = w.norm_eps;
    a.has_lower_bound = w.lower_bound.has_value();
    a.lower_bound = w.lower_bound.value_or(0.0f);
    a.slots = d_slots;
    a.slot_count = pool->recurrent.dim(0);
    a.recurrent = F(pool->recurrent);
    a.window_q = F(pool->conv_q);
    a.window_k = F(pool->conv_k);
    a.window_v = F(pool->conv_v);
    a.out = F(*o);
    cuda::KdaDecode(a, stream_);
  }

  void MlaAttention(const Tensor& q, const Tensor& cache_c, const Tensor& cache_ks, const Tensor& w_kvb,
                    const MlaShape& s, int64_t start, MlaForm form, Tensor* o) override {
    const int64_t T = Rows(q), H = s.heads, dn = s.nope_dim, dr = s.rope_dim, dv = s.v_dim, r = s.latent_dim;
    const int64_t S = start + T;
    KIMIRT_CHECK(Rows(cache_c) >= S && Cols(cache_c) == r && Cols(q) == H * (dn + dr));
    cuda::AttentionArgs a;
    a.T = T;
    a.H = H;
    a.start = start;
    a.scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));
    a.kb = F(cache_ks);
    a.kb_s = dr;
    a.db = dr;
    a.o = F(*o);
    if (form == MlaForm::kExpanded) {
      // k_n and v of every cached position for every head: one GEMM, [S, H·(dn+dv)].
      Tensor kv = Raw({S, H * (dn + dv)}, DType::kF32);
      GemmW(F(cache_c), w_kvb, F(kv), S, H * (dn + dv), r);
      a.q = F(q);
      a.q_t = H * (dn + dr);
      a.q_h = dn + dr;
      a.ka = F(kv);
      a.ka_s = H * (dn + dv);
      a.ka_h = dn + dv;
      a.da = dn;
      a.v = F(kv) + dn;
      a.v_s = H * (dn + dv);
      a.v_h = dn + dv;
      a.dv = dv;
      a.o_t = H * dv;
      a.o_h = dv;
      cuda::CausalAttention(a, stream_);
      return;
    }
    // Absorbed (spec §6.6): attend in the latent space, expand the output afterwards.
    Tensor qc = Raw({T, H, r + dr}, DType::kF32);
    const bool bf16 = w_kvb.dtype() == DType::kBF16;
    cuda::AbsorbQuery(F(q), T, H, dn, dr, dv, r, W(w_kvb), bf16, F(qc), stream_);
    Tensor o_bar = Raw({T, H, r}, DType::kF32);
    a.q = F(qc);
    a.q_t = H * (r + dr);
    a.q_h = r + dr;
    a.ka = F(cache_c);
    a.ka_s = r;
    a.da = r;
    a.v = F(cache_c);
    a.v_s = r;
    a.dv = r;
    a.o = F(o_bar);
    a.o_t = H * r;
    a.o_h = r;
    cuda::CausalAttention(a, stream_);
    cuda::AbsorbOutput(F(o_bar), T, H, dn, dv, r, W(w_kvb), bf16, F(*o), stream_);
  }

  void MoeRoute(const Tensor& y, const Tensor& w, const Tensor& bias, const RouteParams& p, Tensor* idx,
                Tensor* weights) override {
    const int64_t T = Rows(y), D = Cols(y), E = Rows(w), k = p.top_k;
    const int64_t ks = p.append_expert >= 0 ? k + 1 : k;
    KIMIRT_CHECK(Cols(w) == D && bias.numel() == E && k >= 1 && k <= E && Cols(*idx) == ks && Cols(*weights) == ks);
    const Tensor logits = RouterLogits(y, w);
    cuda::MoeRoute(F(logits), F(bias), T, E, k, p.renormalize, p.scaling, p.combine_biased, p.append_expert,
                   static_cast<int32_t*>(idx->raw()), F(*weights), stream_);
  }

  // Routed experts (spec §7.2 steps 3-4), with no host round trip at any token count: the
  // (token, slot) choices are grouped by expert on the device, each chosen expert's weights are
  // read once for all its tokens, and the combine sums a token's k results in top-k order.
  void MoeExperts(const Tensor& z, const Tensor& idx, const Tensor& weights, const ExpertWeights& ex,
                  const GluParams& p, Tensor* out) override {
    if (Rows(z) == 0) return;
    RunExperts(z, idx, weights, ex, PointersOf(ex, nullptr), p, out);
  }

  // The shared expert as expert E of a decode step's experts (Backend::MoeSharedAsExpert): the
  // same tensor-core kernels, BF16 like the routed ones, so one pass over all the weights and no
  // dense-MLP launches (its GEMMs, split-k sums, GLU and the Add: ~24 µs a Kimi-Linear layer at
  // batch 1, Nsight Compute). Its sums are the expert kernels' (k split for top-k + 1), not the
  // dense GEMMs': a different F32 rounding of the same MLP, fixed by the widths alone, so batch
  // invariance holds. KIMIRT_MOE_SHARED_AS_EXPERT=0 turns it off, for A/B runs.
  bool MoeSharedAsExpert(const ExpertWeights& ex, const MlpTensors& shared, int64_t T) override {
    static const bool enabled = cuda::EnvSwitchOn("KIMIRT_MOE_SHARED_AS_EXPERT");
    if (!enabled || T < 1 || T > cuda::kGemvMaxRows || ex.gate.empty() || ex.mxfp4()) return false;
    const Tensor& g0 = ex.gate[0];
    const auto same = [&](const Tensor& a, const Tensor& b) {
      return a.dtype() == DType::kBF16 && a.device() == Device::kCuda && a.shape() == b.shape();
    };
    return g0.dtype() == DType::kBF16 && same(shared.gate, g0) && same(shared.up, ex.up[0]) &&
           same(shared.down, ex.down[0]) && Tiled(shared.gate.raw()) == Tiled(g0.raw());
  }
  void MoeExpertsWithShared(const Tensor& z, const Tensor& idx, const Tensor& weights, const ExpertWeights& ex,
                            const MlpTensors& shared, const GluParams& p, Tensor* out) override {
    KIMIRT_CHECK(MoeSharedAsExpert(ex, shared, Rows(z)));
    RunExperts(z, idx, weights, ex, PointersOf(ex, &shared), p, out);
  }
  // The route chain of a decode step in one launch (cuda::MoeRouteGroupSplit: the top-k, the
  // grouping and the experts' split of y), after the router GEMM; then the experts as
  // MoeExpertsWithShared runs them. The same kernels' code, so the same bits as the two calls.
  // KIMIRT_MOE_FUSED_ROUTE=0: the two calls, for A/B runs.
  void MoeRouteExpertsWithShared(const Tensor& y, const Tensor& router, const Tensor& bias, const RouteParams& rp,
                                 const ExpertWeights& ex, const MlpTensors& shared, const GluParams& p,
                                 Tensor* out) override {
    static const bool enabled = cuda::EnvSwitchOn("KIMIRT_MOE_FUSED_ROUTE");
    const int64_t T = Rows(y), D = Cols(y), E = Rows(router), k = rp.top_k, ks = k + 1;
    const auto unfused = [&] { Backend::MoeRouteExpertsWithShared(y, router, bias, rp, ex, shared, p, out); };
    if (!enabled || rp.append_expert != E || !MoeSharedAsExpert(ex, shared, T)) return unfused();
    const ExpertPointers& ptrs = PointersOf(ex, &shared);
    const int64_t I = Rows(ex.gate[0]);
    if (!cuda::MoeRouteGroupSplitSupported(T, E, k, ptrs.E) || !cuda::MoeDecodeSupported(D, I, 1, ptrs.aligned16)) {
      return unfused();
    }
    KIMIRT_CHECK(Cols(router) == D && bias.numel() == E && ptrs.E == E + 1);
    // The shared expert, which every token runs, while the router GEMV and the route chain (latency-
    // bound, ~10 µs at batch 1) leave HBM idle; the routed experts are known only after them.
    const Tensor* const next[] = {&shared.gate, &shared.up, &shared.down};
    PrefetchWeights(next);
    const Tensor logits = RouterLogits(y, router);
    Tensor idx = Raw({T, ks}, DType::kI32), weights = Raw({T, ks}, DType::kF32);
    const ExpertGroupsBuffer g(*this, T * ks, ptrs.E);
    Tensor scratch = Scratch(cuda::MoeDecodeScratchBytes(T, ks, D, I));
    cuda::MoeRouteGroupSplit(F(logits), F(bias), T, E, k, rp.renormalize, rp.scaling, rp.combine_biased,
                             rp.append_expert, static_cast<int32_t*>(idx.raw()), F(weights), ptrs.E, g.groups, F(y),
                             D, scratch.raw(), stream_);
    RunDecodeExperts(y, ks, g, ex, ptrs, p, F(weights), scratch.raw(), out, /*z_split_done=*/true);
  }

 private:
  friend class CudaKvStorage;

  // Device arrays of every expert's gate / up / down weight pointers (and, MXFP4, scale
  // pointers), made once per weight set.
  struct ExpertPointers {
    Tensor table;                   // 6·E pointers
    std::vector<const void*> host;  // the same, to check the entry still names these tensors
    int64_t E = 0;
    bool aligned16 = false;        // every weight (codes) 16-byte aligned: the tensor-core kernels' loads
    bool scales_aligned4 = false;  // every MXFP4 scale pointer 4-byte aligned: the decode's scale words
    bool tiled = false;            // every weight decode-tiled (HoldExpertWeights)
    uint64_t tiled_version = 0;    // TiledSet::version when `tiled` was counted
    cuda::ExpertPointerTable view() const {
      const void* const* p = static_cast<const void* const*>(table.raw());
      auto scales = [&](int64_t at) { return reinterpret_cast<const uint8_t* const*>(p + at * E); };
      return {p, p + E, p + 2 * E, scales(3), scales(4), scales(5), tiled};
    }
  };
  // `shared` (BF16 experts only): appended as expert E.
  const ExpertPointers& PointersOf(const ExpertWeights& ex, const MlpTensors* shared) {
    // Keyed by the first gate tensor's address and the expert count (with or without the shared
    // one), and checked pointer by pointer: freed weights can hand their addresses to a new
    // weight set (the pool reuses blocks).
    const bool mxfp4 = ex.mxfp4();
    KIMIRT_CHECK(shared == nullptr || !mxfp4);
    const size_t E = ex.gate.size() + (shared != nullptr ? 1 : 0);
    std::vector<const void*> host;
    for (int m = 0; m < 3; ++m) {
      const std::vector<Tensor>& list = m == 0 ? ex.gate : m == 1 ? ex.up : ex.down;
      KIMIRT_CHECK(list.size() == ex.gate.size());
      for (const Tensor& w : list) host.push_back(mxfp4 ? Codes(w) : W(w));
      if (shared != nullptr) host.push_back(W(m == 0 ? shared->gate : m == 1 ? shared->up : shared->down));
    }
    for (const auto* list : {&ex.gate_scales, &ex.up_scales, &ex.down_scales}) {
      KIMIRT_CHECK(!mxfp4 || list->size() == E);
      for (size_t e = 0; e < E; ++e) host.push_back(mxfp4 ? Codes((*list)[e]) : nullptr);
    }
    // A table made for these pointers while the tiled set was as it is now holds: counting the
    // tiled ones again took a locked set lookup a pointer, ~2,700 for a K3 layer (~0.2 ms of host
    // time every MoE call, which eager steps and prefill pay).
    ExpertPointers& ptrs = expert_pointers_[{host.front(), E}];
    const uint64_t version = TiledVersion();
    if (ptrs.host == host && ptrs.tiled_version == version) return ptrs;
    // One layout for the table (HoldExpertWeights tiles a layer's experts and its shared one
    // together; MoeSharedAsExpert declines a shared expert of the other layout).
    const size_t weights = 3 * E;
    const auto tiled = static_cast<size_t>(
        std::count_if(host.begin(), host.begin() + static_cast<std::ptrdiff_t>(weights), [&](const void* p) { return Tiled(p); }));
    KIMIRT_CHECK_MSG(tiled == 0 || tiled == weights, "an expert table mixes decode-tiled and row-major weights");
    ptrs.tiled_version = version;
    ptrs.E = static_cast<int64_t>(E);
    ptrs.scales_aligned4 = std::all_of(host.begin() + static_cast<std::ptrdiff_t>(3 * E), host.end(),
                                       [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 4 == 0; });
    ptrs.table = Raw({static_cast<int64_t>(host.size() * sizeof(void*))}, DType::kU8);
    CopyToDevice(ptrs.table.raw(), host.data(), host.size() * sizeof(void*));
    ptrs.tiled = tiled == weights;
    ptrs.aligned16 = std::all_of(host.begin(), host.begin() + 3 * static_cast<std::ptrdiff_t>(E),
                                 [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; });
    ptrs.host = std::move(host);
    return ptrs;
  }

  bool RouterAsStored() const override { return true; }

  // Spec §7.2 step 1: logits [T, E] = float(y) · float(W_router)ᵀ in F32, whatever the router is
  // held as (RouterAsStored: BF16 as the checkpoint stores it, half the bytes a step). The F32 Gemv
  // up to kGemvMaxRows rows (row-invariant) and cuBLAS's SGEMM past them, on the weight widened to
  // F32 where it is BF16 (whole: the F32 router's very call): the same F32 values in the same sums,
  // so the same logits either way (CudaBackendGemv, CudaBackendMoe.Bf16RouterGivesTheF32RoutersChoices),
  // never the BF16 tensor-core GEMMs.
  Tensor RouterLogits(const Tensor& y, const Tensor& router) {
    const int64_t m = Rows(y), n = Rows(router), k = Cols(y);
    Tensor logits = Raw({m, n}, DType::kF32);
    const bool bf16 = router.dtype() == DType::kBF16;
    if (m == 0 || n == 0 || k == 0) {
      Gemm(F(y), nullptr, F(logits), m, n, k);  // nothing, or zeros
    } else if (m <= cuda::kGemvMaxRows) {
      cuda::Gemv(F(y), W(router), bf16, F(logits), m, n, k, stream_);
    } else if (bf16) {
      SgemmWidened(F(y), W(router), F(logits), m, n, k, n);
    } else {
      Gemm(F(y), F(router), F(logits), m, n, k);
    }
    return logits;
  }

  // Device arrays for the grouping of n (token, slot) choices over E experts (cuda::ExpertGroups).
  struct ExpertGroupsBuffer {
    Tensor sort;
    cuda::ExpertGroups groups;
    int64_t max_active = 0;
    ExpertGroupsBuffer(CudaBackend& be, int64_t n, int64_t E) : max_active(std::min(E, n)) {
      sort = be.Raw({2 * n + 2 * max_active + 2}, DType::kI32);
      int32_t* base = static_cast<int32_t*>(sort.raw());
      groups.order = base;
      groups.pos = base + n;
      groups.active = base + 2 * n;
      groups.begin = groups.active + max_active;
      groups.num_active = groups.begin + max_active + 1;
    }
  };

  // The decode experts (cuda::MoeDecodeExperts) of z's T rows, k slots each, grouped in g.
  void RunDecodeExperts(const Tensor& z, int64_t k, const ExpertGroupsBuffer& g, const ExpertWeights& ex,
                        const ExpertPointers& ptrs, const GluParams& p, const float* weights, void* scratch,
                        Tensor* out, bool z_split_done) {
    const bool mxfp4 = ex.mxfp4();
    const int64_t T = Rows(z), De = Cols(z), I = Rows(ex.gate[0]);
    const int format = mxfp4 ? 2 : 1;
    // Token tiles by the routed load, unless a shared expert rides last (it takes every token)
    // or KIMIRT_MOE_TILES_BY_LOAD=0 (by T, as before: A/B runs). Part columns for a light load
    // (ExpertWeights::light_load, from the config: never from T, so a token's bits stay the same
    // at every batch) when only routed experts run (KIMIRT_MOE_PART_COLUMNS=0: 8 tokens a tile,
    // for A/B runs).
    const auto E = static_cast<int64_t>(ex.gate.size());
    static const bool by_load_on = cuda::EnvSwitchOn("KIMIRT_MOE_TILES_BY_LOAD");
    static const bool part_columns_on = cuda::EnvSwitchOn("KIMIRT_MOE_PART_COLUMNS");
    const bool by_load = ptrs.E == E && by_load_on;
    const bool part_columns = ex.light_load && ptrs.E == E && part_columns_on;
    cuda::MoeDecodeExperts(F(z), T, k, g.groups, g.max_active, De, I, ptrs.view(), format,
                           mxfp4 && De % 128 == 0 && I % 128 == 0 && ptrs.scales_aligned4,
                           p.kind == GluKind::kSilu ? 0 : 1, p.beta, p.linear_beta.has_value(),
                           p.linear_beta.value_or(1.0f), weights, scratch, F(*out), stream_, z_split_done,
                           cuda::MoeDecodeTokenTiles(T, k, by_load ? E : 0, part_columns), part_columns);
  }

  // MoeExperts over the experts of `ptrs` (ex's, and the shared one last if it was given).
  void RunExperts(const Tensor& z, const Tensor& idx, const Tensor& weights, const ExpertWeights& ex,
                  const ExpertPointers& ptrs, const GluParams& p, Tensor* out) {
    const int64_t T = Rows(z), De = Cols(z), k = Cols(idx);
    const int64_t E = ptrs.E;
    const bool mxfp4 = ex.mxfp4();
    const int64_t I = Rows(ex.gate[0]);
    const int64_t per_byte = mxfp4 ? 2 : 1;
    KIMIRT_CHECK(E > 0 && Cols(ex.gate[0]) * per_byte == De && Cols(ex.down[0]) * per_byte == I &&
                 Rows(ex.down[0]) == De && Cols(weights) == k);
    const int64_t n = T * k;
    const ExpertGroupsBuffer eg(*this, n, E);
    const cuda::ExpertGroups& g = eg.groups;
    const int64_t max_active = eg.max_active;
    cuda::MoeGroupByExpert(static_cast<const int32_t*>(idx.raw()), n, E, g, stream_);
    const int format = mxfp4 ? 2 : ex.gate[0].dtype() == DType::kBF16 ? 1 : 0;
    const int kind = p.kind == GluKind::kSilu ? 0 : 1;
    // Decode steps (the row-invariant range): tensor cores, each token's sums fixed by the widths
    // (moe_kernels.cu, docs/cuda.md "MoE decode"), the combine included.
    if (T <= cuda::kGemvMaxRows && cuda::MoeDecodeSupported(De, I, format, ptrs.aligned16)) {
      Tensor scratch = Scratch(cuda::MoeDecodeScratchBytes(T, k, De, I));
      RunDecodeExperts(z, k, eg, ex, ptrs, p, F(weights), scratch.raw(), out, /*z_split_done=*/false);
      return;
    }
    Tensor grouped = Raw({n, De}, DType::kF32);
    if (T > cuda::kGemvMaxRows && bf16_prefill() && format != 0 && cuda::MoePrefillSupports(De, I, mxfp4) &&
        ptrs.aligned16) {
      // Prefill: BF16 tensor cores (moe_prefill_kernels.cu), the same bits for MXFP4 and BF16.
      Tensor scratch = Scratch(cuda::MoePrefillScratchBytes(T, k, De, I, max_active));
      cuda::MoePrefillExperts(F(z), T, k, g, max_active, De, I, ptrs.view(), mxfp4, kind, p.beta,
                              p.linear_beta.has_value(), p.linear_beta.value_or(1.0f), scratch.raw(), F(grouped),
                              stream_);
    } else {
      Tensor h = Raw({n, I}, DType::kF32);
      cuda::MoeGroupedExperts(F(z), k, g, max_active, De, I, ptrs.view(), format, kind, p.beta,
                              p.linear_beta.has_value(), p.linear_beta.value_or(1.0f), F(h), F(grouped), stream_);
    }
    cuda::MoeCombine(F(grouped), g.pos, F(weights), T, k, De, F(*out), stream_);
  }

  // MXFP4 codes or scales (U8) on this device.
  static const void* Codes(const Tensor& t) {
    if (t.dtype() != DType::kU8 || t.device() != Device::kCuda) {
      std::fprintf(stderr, "kimirt: CUDA backend MXFP4 codes and scales must be U8 device tensors, got %s\n",
                   t.ToString().c_str());
      std::abort();
    }
    return t.raw();
  }

  static float* F(const Tensor& t) {
    if (t.dtype() != DType::kF32 || (t.device() != Device::kCuda && t.numel() != 0)) {
      std::fprintf(stderr, "kimirt: CUDA backend op on a non-F32 or host tensor %s\n", t.ToString().c_str());
      std::abort();
    }
    return static_cast<float*>(const_cast<void*>(t.raw()));
  }

  // Weights only Linear reads (Backend::HoldForLinearOnly: the projections, the dense MLPs, the
  // head) and BF16 experts (HoldExpertWeights) are held in the layout DecodeGemm streams best
  // (cuda::TileWeightForDecode: a warp's round of weight loads one contiguous 8 KB instead of
  // 64-byte pieces of 8 rows); DecodeGemm, the wgmma PrefillGemm and the MoE's decode and wgmma
  // prefill kernels read it with the same values reaching the same MMAs, so every result keeps its
  // bits. A BF16 [n, k] weight with n % 32 == 0 and k % 128 == 0 only.
  void HoldForLinearOnly(Tensor* w) override {
    if (TiledOn() && Tileable(*w)) TileInPlace({&w, 1});
  }

  // Routed BF16 experts, all or none (the MoE kernels take one layout for a layer), and the shared
  // expert with them, so that it can still run as expert E (MoeSharedAsExpert wants one layout
  // across the table). Beside MXFP4 experts the shared expert is read by Linear alone.
  void HoldExpertWeights(ExpertWeights* ex, Tensor* shared_gate, Tensor* shared_up, Tensor* shared_down) override {
    if (!TiledOn() || ex->gate.empty()) return;
    std::vector<Tensor*> shared;
    for (Tensor* t : {shared_gate, shared_up, shared_down}) {
      if (t != nullptr && t->defined() && t->numel() > 0) shared.push_back(t);
    }
    const bool shared_ok = shared.size() == 3 && std::all_of(shared.begin(), shared.end(), [&](Tensor* t) { return Tileable(*t); });
    if (ex->mxfp4()) {
      if (shared_ok) TileInPlace(shared);
      TileMxfp4Experts(ex);
      return;
    }
    std::vector<Tensor*> all;
    for (auto* list : {&ex->gate, &ex->up, &ex->down}) {
      for (Tensor& t : *list) all.push_back(&t);
    }
    if (!std::all_of(all.begin(), all.end(), [&](Tensor* t) { return Tileable(*t); })) return;
    if (shared_ok) all.insert(all.end(), shared.begin(), shared.end());
    TileInPlace(all);
  }

 private:
  // KIMIRT_DECODE_TILED=0 keeps every weight row-major (A/B runs).
  static bool TiledOn() {
    static const bool on = cuda::EnvSwitchOn("KIMIRT_DECODE_TILED");
    return on;
  }
  bool Tileable(const Tensor& w) const {
    return w.device() == Device::kCuda && w.dtype() == DType::kBF16 && w.rank() == 2 &&
           cuda::DecodeGemmTileable(w.dim(0), w.dim(1)) && reinterpret_cast<uintptr_t>(w.raw()) % 16 == 0 &&
           !Tiled(w.raw());
  }
  // MXFP4 codes [n, k/2] (U8) that mxfp4_tiled.cuh's layout takes.
  bool Mxfp4Tileable(const Tensor& codes) const {
    return codes.device() == Device::kCuda && codes.dtype() == DType::kU8 && codes.rank() == 2 &&
           cuda::Mxfp4Tileable(codes.dim(0), 2 * codes.dim(1)) && reinterpret_cast<uintptr_t>(codes.raw()) % 16 == 0 &&
           !Tiled(codes.raw());
  }
  // A layer's MXFP4 expert codes, all or none, re-laid out for the decode kernel (mxfp4_tiled.cuh:
  // no quad exchange, fewer instructions a word, 512-byte loads); the decode and prefill kernels
  // read them with the same bits, the F32 grouped path cannot, so only with bf16_prefill on. On
  // unless KIMIRT_MXFP4_TILED=0 (read at each call, so a test can set it): on an H100, K3's MoE
  // layer decodes 1.09-1.26x faster and the K3 2-layer prefills 1.28x (docs/cuda.md "MXFP4 codes
  // tiled").
  void TileMxfp4Experts(ExpertWeights* ex) {
    if (!cuda::EnvSwitchOn("KIMIRT_MXFP4_TILED") || !bf16_prefill()) return;
    std::vector<Tensor*> codes;
    for (auto* list : {&ex->gate, &ex->up, &ex->down}) {
      for (Tensor& t : *list) codes.push_back(&t);
    }
    if (!std::all_of(codes.begin(), codes.end(), [&](Tensor* t) { return Mxfp4Tileable(*t); })) return;
    TileInPlace(codes, [&](const Tensor& w, void* dst) {
      cuda::TileMxfp4Codes(w.raw(), dst, w.dim(0), 2 * w.dim(1), stream_);
    });
  }
  // Each weight re-laid out in its own buffer (through one temporary of the largest's size, so the
  // allocator's count of weight bytes stays what it was) and entered in tiled_; each entry lives as
  // long as the buffer: the new owner's deleter drops it, then lets the old owner go, so an
  // allocation later made at the same address is never taken for a tiled one.
  void TileInPlace(std::span<Tensor* const> ws) {
    TileInPlace(ws, [&](const Tensor& w, void* dst) {
      cuda::TileWeightForDecode(w.raw(), dst, w.dim(0), w.dim(1), stream_);
    });
  }
  template <class Tile>
  void TileInPlace(std::span<Tensor* const> ws, Tile tile) {
    if (ws.empty()) return;
    NotCapturing("tiling a weight");
    size_t most = 0;
    for (const Tensor* w : ws) most = std::max(most, w->nbytes());
    void* tmp = nullptr;
    KIMIRT_CUDA_OK(cudaMalloc(&tmp, most));
    for (Tensor* w : ws) {
      tile(*w, tmp);
      KIMIRT_CUDA_OK(cudaMemcpyAsync(w->raw(), tmp, w->nbytes(), cudaMemcpyDeviceToDevice, stream_));
    }
    Synchronize();
    KIMIRT_CUDA_OK(cudaFree(tmp));
    for (Tensor* w : ws) {
      void* p = w->raw();
      {
        std::lock_guard<std::mutex> lock(tiled_->mu);
        tiled_->ptrs.insert(p);
        ++tiled_->version;
      }
      std::shared_ptr<void> owner(p, [old = *w, tiled = tiled_](void* q) {
        std::lock_guard<std::mutex> lock(tiled->mu);
        tiled->ptrs.erase(q);
        ++tiled->version;
      });
      *w = Tensor(std::move(owner), p, w->shape(), w->dtype(), Device::kCuda);
    }
  }

 public:
  bool Tiled(const void* w) const {
    std::lock_guard<std::mutex> lock(tiled_->mu);
    return tiled_->ptrs.count(w) != 0;
  }
  uint64_t TiledVersion() const {
    std::lock_guard<std::mutex> lock(tiled_->mu);
    return tiled_->version;
  }

  // A weight held as F32 or BF16 on this device.
  static const void* W(const Tensor& t) {
    if ((t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) || t.device() != Device::kCuda) {
      std::fprintf(stderr, "kimirt: CUDA backend weight must be an F32 or BF16 device tensor, got %s\n",
                   t.ToString().c_str());
      std::abort();
    }
    return t.raw();
  }

  // y [m, n] = x [m, k] · w [n, k]ᵀ for a weight held as F32 or BF16. Up to kGemvMaxRows rows
  // (decode) a row-invariant kernel: BF16 on tensor cores with x split hi + mid + lo (DecodeGemm, the
  // weight read once for all rows), F32 on the FP32 cores (Gemv). More rows (prefill): a BF16
  // weight with bf16_prefill() on goes to PrefillGemm (x rounded to BF16, tensor cores, the same
  // tile whatever m is); otherwise cuBLAS SGEMM, a BF16 weight widened to F32 in chunks of at
  // most 16 M elements first.
  // Whether GemmW of m rows takes PrefillGemm (a BF16 weight, bf16_prefill(), past the decode rows).
  bool ExpandsRowInvariantly(const Tensor& w) const { return w.dtype() == DType::kBF16 && bf16_prefill(); }
  bool TakesPrefillGemm(const Tensor& w, int64_t m, int64_t n, int64_t k) const {
    return m > cuda::kGemvMaxRows && w.dtype() == DType::kBF16 && bf16_prefill() && n > 0 && k > 0;
  }
  void GemmW(const float* x, const Tensor& w, float* y, int64_t m, int64_t n, int64_t k) {
    const void* wb = W(w);
    // HoldForLinearOnly's layout: DecodeGemm and PrefillGemm read it with the row-major bits;
    // cuBLAS cannot, so with bf16_prefill off a tiled weight takes DecodeGemm 64 rows at a time.
    const bool tiled = Tiled(wb);
    if (k > 0 && (m <= cuda::kGemvMaxRows || (tiled && !TakesPrefillGemm(w, m, n, k)))) {
      if (w.dtype() == DType::kBF16 && m > 0 && n > 0) {
        for (int64_t r = 0; r < m; r += cuda::kGemvMaxRows) {
          const int64_t rows = std::min(cuda::kGemvMaxRows, m - r);
          Tensor scratch = Scratch(cuda::DecodeGemmScratchBytes(rows, n, k));
          cuda::DecodeGemm(x + r * k, wb, y + r * n, rows, n, k, scratch.raw(), stream_, tiled);
        }
      } else {
        cuda::Gemv(x, wb, w.dtype() == DType::kBF16, y, m, n, k, stream_);
      }
      return;
    }
    if (TakesPrefillGemm(w, m, n, k)) {
      Tensor scratch = Scratch(cuda::PrefillGemmScratchBytes(m, n, k, wb));
      cuda::PrefillGemm(x, wb, y, m, n, k, scratch.raw(), stream_, tiled);
      return;
    }
    if (w.dtype() == DType::kF32) {
      Gemm(x, F(w), y, m, n, k);
      return;
    }
    if (m == 0 || n == 0 || k == 0) {
      Gemm(x, nullptr, y, m, n, k);
      return;
    }
    SgemmWidened(x, wb, y, m, n, k, std::max<int64_t>(1, (int64_t{16} << 20) / k));
  }

  // y [m, n] = x · wᵀ for a BF16 weight w [n, k] (m, n, k > 0): chunk_rows rows of w at a time
  // widened to F32 into scratch, then cuBLAS's SGEMM of the chunk. With chunk_rows ≥ n, the very
  // call an F32-held w gets (Gemm).
  void SgemmWidened(const float* x, const void* wb, float* y, int64_t m, int64_t n, int64_t k, int64_t chunk_rows) {
    Tensor scratch = Raw({std::min(n, chunk_rows) * k}, DType::kF32);
    const float one = 1.0f, zero = 0.0f;
    for (int64_t n0 = 0; n0 < n; n0 += chunk_rows) {
      const int64_t nn = std::min(chunk_rows, n - n0);
      cuda::Bf16ToF32(static_cast<const uint16_t*>(wb) + n0 * k, F(scratch), nn * k, stream_);
      KIMIRT_CUBLAS_OK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nn), static_cast<int>(m),
                                   static_cast<int>(k), &one, F(scratch), static_cast<int>(k), x, static_cast<int>(k),
                                   &zero, y + n0, static_cast<int>(n)));
    }
  }

  // y [m, n] in BF16 := x · wᵀ, MLA prefill's expansion. With BF16 weights in bf16_prefill mode
  // the prefill tile whatever m (GemmW takes the decode GEMMs for m ≤ 64), each sum rounded as
  // it is stored, no F32 y in memory: a key row's bits never depend on how many rows were expanded
  // with it, so a history expanded chunk by chunk and kept (expanded_history.h) equals one
  // expanded whole. Otherwise ToBf16 of GemmW's y.
  void GemmWBf16Out(const float* x, const Tensor& w, void* y, int64_t m, int64_t n, int64_t k) {
    if (ExpandsRowInvariantly(w) && m > 0 && n > 0 && k > 0) {
      Tensor scratch = Scratch(cuda::PrefillGemmScratchBytes(m, n, k, W(w)));
      cuda::PrefillGemmBf16Out(x, W(w), y, m, n, k, scratch.raw(), stream_);
      return;
    }
    Tensor f = Raw({m, n}, DType::kF32);
    GemmW(x, w, F(f), m, n, k);
    cuda::ToBf16(F(f), y, m * n, stream_);
  }

  // Device scratch of `bytes` bytes from the pool (its blocks are cudaMalloc'd: 256-byte aligned).
  Tensor Scratch(size_t bytes) { return Raw({static_cast<int64_t>((bytes + 3) / 4)}, DType::kF32); }

  // AttnResMix's candidates as the launch's by-value pointer list.
  cuda::AttnResCandidates Candidates(std::span<const Tensor* const> cands) {
    KIMIRT_CHECK(!cands.empty() && cands.size() <= static_cast<size_t>(cuda::kAttnResMaxCandidates));
    cuda::AttnResCandidates c;
    for (const Tensor* t : cands) c.p[c.n++] = F(*t);
    return c;
  }

  // An uninitialized device tensor from the pool (while capturing, the graph's own pool).
  Tensor Raw(Shape shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
    if (bytes == 0) return Tensor(nullptr, nullptr, std::move(shape), dtype, Device::kCuda);
    if (weight_slabs_ != nullptr && !capture_pool_) {
      std::shared_ptr<void> owner = weight_slabs_->Get(bytes);
      void* p = owner.get();
      return Tensor(std::move(owner), p, std::move(shape), dtype, Device::kCuda);
    }
    const std::shared_ptr<DevicePool>& from = capture_pool_ ? capture_pool_ : pool_;
    void* p = from->Get(bytes);
    std::shared_ptr<void> owner(p, [pool = from, bytes](void* q) { pool->Put(q, bytes); });
    return Tensor(std::move(owner), p, std::move(shape), dtype, Device::kCuda);
  }

  Tensor UploadInts(std::span<const int32_t> v) {
    Tensor t = Raw({static_cast<int64_t>(v.size())}, DType::kI32);
    if (!v.empty()) CopyToDevice(t.raw(), v.data(), v.size() * sizeof(int32_t));
    return t;
  }

  // Copies `bytes` host bytes to device `dst` on the stream. From pageable memory
  // cudaMemcpyAsync may return before the driver has read the source, so the bytes are copied
  // into `in_flight_`, which keeps them until the stream is next synchronized (Download, or here
  // once more than kMaxInFlight copies or kMaxInFlightBytes are held). The copies are small
  // (token ids, block tables, pointer arrays), a few per layer. (A pinned staging ring in their
  // place measured no gain: docs/cuda.md.)
  void CopyToDevice(void* dst, const void* src, size_t bytes) {
    NotCapturing("an upload");
    const uint8_t* from = static_cast<const uint8_t*>(src);
    in_flight_.emplace_back(from, from + bytes);
    in_flight_bytes_ += bytes;
    KIMIRT_CUDA_OK(cudaMemcpyAsync(dst, in_flight_.back().data(), bytes, cudaMemcpyHostToDevice, stream_));
    if (in_flight_.size() > kMaxInFlight || in_flight_bytes_ > kMaxInFlightBytes) Synchronize();
  }

  // Waits for the stream; every host buffer a queued copy read from may go.
  void Synchronize() {
    NotCapturing("a wait for the stream");
    JoinPrefetches();  // so nothing still reads a weight a caller may free after this
    KIMIRT_CUDA_OK(cudaStreamSynchronize(stream_));
    in_flight_.clear();
    in_flight_bytes_ = 0;
  }

  // y [m, n] = x [m, k] · w [n, k]ᵀ, row-major: in cuBLAS's column-major terms yᵀ = w · xᵀ.
  void Gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      KIMIRT_CUDA_OK(cudaMemsetAsync(y, 0, static_cast<size_t>(m * n) * sizeof(float), stream_));
      return;
    }
    const float one = 1.0f, zero = 0.0f;
    KIMIRT_CUBLAS_OK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                 static_cast<int>(k), &one, w, static_cast<int>(k), x, static_cast<int>(k), &zero, y,
                                 static_cast<int>(n)));
  }

  void GluRaw(const float* gate, const float* up, float* y, int64_t n, const GluParams& p) {
    cuda::Glu(gate, up, y, n, p.kind == GluKind::kSilu ? 0 : 1, p.beta, p.linear_beta.has_value(),
              p.linear_beta.value_or(1.0f), stream_);
  }

  // A graph is made of launches only: anything that needs the host mid-step is a bug there.
  void NotCapturing(const char* what) const {
    if (capture_pool_) {
      std::fprintf(stderr, "kimirt: %s while capturing the decode graph %s\n", what, capture_key_.c_str());
      std::abort();
    }
  }

  // Device ids or slots: the registered decode inputs (SetDecodeInputs) when `v` holds the same
  // values, else a fresh upload kept alive by `tmp`.
  const int32_t* DecodeInput(std::span<const int32_t> v, const std::vector<int32_t>& host, const Tensor& dev,
                             Tensor* tmp) {
    if (!v.empty() && v.size() == host.size() && std::equal(v.begin(), v.end(), host.begin())) {
      return static_cast<const int32_t*>(dev.raw());
    }
    *tmp = UploadInts(v);
    return static_cast<const int32_t*>(tmp->raw());
  }

  // Where a graph is stored: the caller's key, plus the step's KDA slots for shapes whose graph
  // bakes them in (the unfused KdaDecode: the fixtures' small heads).
  std::string StoredKey(const std::string& key) const {
    if (slot_bound_keys_.count(key) == 0) return key;
    std::string k = key;
    k.append(":slots");
    for (int32_t v : decode_slots_host_) {
      k.push_back(':');
      k.append(std::to_string(v));
    }
    return k;
  }

  struct Graph {
    cudaGraphExec_t exec = nullptr;
    std::shared_ptr<DevicePool> pool;  // the graph's tensors; outlives exec (destroyed after it)
    Tensor output;
    uint64_t last_use = 0;
  };
  // Its launches may still run when a graph goes: wait first.
  void EraseGraph(std::map<std::string, Graph>::iterator it) {
    Synchronize();
    DestroyGraph(it->second);
    graphs_.erase(it);
  }
  static void DestroyGraph(Graph& g) {
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    g.exec = nullptr;
  }

  int device_;
  cudaStream_t stream_;
  cublasHandle_t blas_;
  std::shared_ptr<DevicePool> pool_;
  // The buffers HoldForLinearOnly and HoldExpertWeights tiled (shared with their owners' deleters).
  struct TiledSet {
    std::mutex mu;
    std::set<const void*> ptrs;
    uint64_t version = 0;  // counts the changes to ptrs (PointersOf's cached tables check it)
  };
  std::shared_ptr<TiledSet> tiled_ = std::make_shared<TiledSet>();
  // PrefetchWeights' stream and its fork and join events (made at the first call); whether it has
  // work since the last join.
  cudaStream_t prefetch_stream_ = nullptr;
  cudaEvent_t prefetch_fork_ = nullptr, prefetch_join_ = nullptr;
  bool prefetch_forked_ = false;
  // Decode graphs by key (Backend::CaptureBegin), at most kMaxGraphs (least recently used go).
  static constexpr size_t kMaxGraphs = 64;
  std::map<std::string, Graph> graphs_;
  uint64_t graph_tick_ = 0;
  std::shared_ptr<DevicePool> capture_pool_;  // set while capturing
  std::unique_ptr<WeightSlabs> weight_slabs_;  // set while a model's weights load (BeginWeights)
  std::string capture_key_;
  bool capture_slot_bound_ = false;
  std::set<std::string> slot_bound_keys_;
  // SetDecodeInputs' buffers (fixed addresses, kDecodeInputCap entries) and their host values.
  static constexpr int64_t kDecodeInputCap = 1024;
  Tensor decode_ids_, decode_slots_;
  std::vector<int32_t> decode_ids_host_, decode_slots_host_;
  // Host sources of queued copies (CopyToDevice); each vector's buffer stays put when the list
  // grows.
  static constexpr size_t kMaxInFlight = 4096, kMaxInFlightBytes = 64u << 20;
  std::vector<std::vector<uint8_t>> in_flight_;
  size_t in_flight_bytes_ = 0;
  std::map<std::pair<const void*, size_t>, ExpertPointers> expert_pointers_;
};

void CudaKvStorage::Resize(int64_t blocks) {
  if (blocks <= blocks_) return;
  const int64_t rows = blocks * s_.layers * s_.block_size;
  Tensor values = be_.Raw({rows * w_ * static_cast<int64_t>(DTypeSize(s_.dtype))}, DType::kU8);
  Tensor scales = kind_ == 2 ? be_.Raw({rows * 2}, DType::kF32) : Tensor();
  // Keep what was written (only growable private caches ever grow). A default Tensor has rank 0,
  // so "nothing yet" is blocks_ == 0, not nbytes() == 0.
  if (blocks_ > 0) {
    KIMIRT_CUDA_OK(cudaMemcpyAsync(values.raw(), values_.raw(), values_.nbytes(), cudaMemcpyDeviceToDevice, be_.stream_));
  }
  if (blocks_ > 0 && kind_ == 2) {
    KIMIRT_CUDA_OK(cudaMemcpyAsync(scales.raw(), scales_.raw(), scales_.nbytes(), cudaMemcpyDeviceToDevice, be_.stream_));
  }
  values_ = values;
  scales_ = scales;
  blocks_ = blocks;
}

void CudaKvStorage::Write(int layer, std::span<const int32_t> table, int64_t pos, const Tensor& c, const Tensor& ks) {
  const int64_t T = c.dim(0);
  Tensor d_table = be_.UploadInts(table);
  cuda::KvWrite(CudaBackend::F(c), s_.rope_dim > 0 ? CudaBackend::F(ks) : nullptr, T, s_.latent_dim, s_.rope_dim,
                static_cast<const int32_t*>(d_table.raw()), pos, s_.layers, layer, s_.block_size, kind_, values_.raw(),
                kind_ == 2 ? static_cast<float*>(scales_.raw()) : nullptr, be_.stream_);
}

void CudaKvStorage::Gather(int layer, std::span<const int32_t> table, int64_t len, Tensor* c, Tensor* ks) {
  Tensor d_table = be_.UploadInts(table);
  cuda::KvGather(values_.raw(), kind_ == 2 ? static_cast<const float*>(scales_.raw()) : nullptr, 0, len, s_.latent_dim,
                 s_.rope_dim, static_cast<const int32_t*>(d_table.raw()), s_.layers, layer, s_.block_size, kind_,
                 CudaBackend::F(*c), s_.rope_dim > 0 ? CudaBackend::F(*ks) : nullptr, be_.stream_);
}

int64_t NextPow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

void CudaKvStorage::SetDecodeStep(const PagedDecodeStep& step) {
  const int64_t B = step.size();
  // A sequence that decodes is done with prefill: its expanded history goes.
  for (int64_t b = 0; history_ && b < B; ++b) {
    Free(history_->Decoding(step.table(b), step.context[static_cast<size_t>(b)]));
  }
  std::vector<int32_t> split_begin{0}, work;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = step.context[static_cast<size_t>(b)];
    KIMIRT_CHECK_MSG(len > 0 && len <= INT32_MAX, "decode step: context length out of range");
    KIMIRT_CHECK_MSG(static_cast<int64_t>(step.table(b).size()) * s_.block_size >= len,
                     "decode step: a block table does not cover its context");
    // The split schedule: a function of each sequence's own context length (batch invariance).
    const int64_t split = cuda::MlaDecodeSplitLen(len);
    for (int64_t s0 = 0; s0 < len; s0 += split) {
      work.insert(work.end(), {static_cast<int32_t>(b), static_cast<int32_t>(s0),
                               static_cast<int32_t>(std::min(len, s0 + split))});
    }
    split_begin.push_back(static_cast<int32_t>(work.size() / 3));
  }
  step_b_ = B;
  step_work_cap_ = NextPow2(std::max<int64_t>(1, static_cast<int64_t>(work.size() / 3)));
  step_tables_cap_ = NextPow2(std::max<int64_t>(1, static_cast<int64_t>(step.tables.size())));
  std::vector<int32_t> meta;
  meta.reserve(static_cast<size_t>(1 + 3 * B + 2 + 3 * step_work_cap_ + step_tables_cap_));
  meta.push_back(static_cast<int32_t>(work.size() / 3));
  for (int64_t len : step.context) meta.push_back(static_cast<int32_t>(len));
  meta.insert(meta.end(), step.table_begin.begin(), step.table_begin.end());
  meta.insert(meta.end(), split_begin.begin(), split_begin.end());
  const std::vector<int32_t> runs = cuda::MlaDecodePersistSchedule(work, cuda::SmCount());
  work.resize(static_cast<size_t>(3 * step_work_cap_), 0);
  meta.insert(meta.end(), work.begin(), work.end());
  meta.insert(meta.end(), step.tables.begin(), step.tables.end());
  // The persistent split's runs of items (kernels.h MlaDecodePersistSchedule) after the tables'
  // capacity: a constant block count, so one captured launch shape serves every step.
  meta.resize(static_cast<size_t>(meta.size() + step_tables_cap_ - static_cast<int64_t>(step.tables.size())), 0);
  meta.insert(meta.end(), runs.begin(), runs.end());
  const int64_t need = static_cast<int64_t>(meta.size());
  if (step_meta_.raw() == nullptr || need > step_meta_.numel()) step_meta_ = be_.Raw({NextPow2(need)}, DType::kI32);
  be_.CopyToDevice(step_meta_.raw(), meta.data(), meta.size() * sizeof(int32_t));
}

std::string CudaKvStorage::GraphKey() const {
  char key[160];
  std::snprintf(key, sizeof(key), "kv:%p:%p:%p:b%lld:w%lld:t%lld", values_.raw(), scales_.raw(), step_meta_.raw(),
                static_cast<long long>(step_b_), static_cast<long long>(step_work_cap_),
                static_cast<long long>(step_tables_cap_));
  return key;
}

cuda::PagedDecodeArgs CudaKvStorage::StepArgs(int layer) const {
  cuda::PagedDecodeArgs a;
  a.values = values_.raw();
  a.scales = kind_ == 2 ? static_cast<const float*>(scales_.raw()) : nullptr;
  a.kind = kind_;
  a.layers = s_.layers;
  a.layer = layer;
  a.block_size = s_.block_size;
  a.r = s_.latent_dim;
  a.dr = s_.rope_dim;
  a.B = step_b_;
  const int32_t* meta = static_cast<const int32_t*>(step_meta_.raw());
  a.work_count = meta;
  a.context = meta + 1;
  a.table_begin = a.context + step_b_;
  a.split_begin = a.table_begin + step_b_ + 1;
  a.work = a.split_begin + step_b_ + 1;
  a.num_work = step_work_cap_;
  a.tables = a.work + 3 * step_work_cap_;
  a.block_work = a.tables + step_tables_cap_;
  a.persist_blocks = cuda::SmCount();
  a.pool_rows = blocks_ * s_.layers * s_.block_size;
  return a;
}

void CudaKvStorage::WriteDecode(int layer, const Tensor& c, const Tensor& ks) {
  KIMIRT_CHECK(c.dim(0) == step_b_ && layer >= 0 && layer < s_.layers);
  const cuda::PagedDecodeArgs a = StepArgs(layer);
  cuda::KvWriteDecode(CudaBackend::F(c), s_.rope_dim > 0 ? CudaBackend::F(ks) : nullptr, step_b_, s_.latent_dim,
                      s_.rope_dim, a.context, a.table_begin, a.tables, s_.layers, layer, s_.block_size, kind_,
                      values_.raw(), kind_ == 2 ? static_cast<float*>(scales_.raw()) : nullptr, be_.stream_);
}

// Absorbed (spec §6.6): q̄ per (sequence, head), the paged split/combine kernels over the
// latent codes in place, then o = W_UV ō.
void CudaKvStorage::AttendDecode(int layer, const Tensor& q, const Tensor& w_kvb, const MlaShape& shape, Tensor* o) {
  const int64_t B = step_b_, H = shape.heads, dn = shape.nope_dim, dr = shape.rope_dim, dv = shape.v_dim,
                r = shape.latent_dim;
  KIMIRT_CHECK(r == s_.latent_dim && dr == s_.rope_dim && layer >= 0 && layer < s_.layers);
  KIMIRT_CHECK(q.numel() == B * H * (dn + dr) && o->numel() == B * H * dv && w_kvb.dim(1) == r);
  if (B == 0) return;
  const bool bf16 = w_kvb.dtype() == DType::kBF16;
  Tensor qc = be_.Raw({B, H, r + dr}, DType::kF32);
  cuda::AbsorbQuery(CudaBackend::F(q), B, H, dn, dr, dv, r, CudaBackend::W(w_kvb), bf16, CudaBackend::F(qc),
                    be_.stream_);
  cuda::PagedDecodeArgs a = StepArgs(layer);
  a.H = H;
  a.scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));
  Tensor part_o = be_.Raw({step_work_cap_, H, r}, DType::kF32);
  Tensor part_ml = be_.Raw({step_work_cap_, H, 2}, DType::kF32);
  Tensor o_bar = be_.Raw({B, H, r}, DType::kF32);
  cuda::MlaPagedDecode(a, CudaBackend::F(qc), CudaBackend::F(part_o), CudaBackend::F(part_ml), CudaBackend::F(o_bar),
                       be_.stream_);
  cuda::AbsorbOutput(CudaBackend::F(o_bar), B, H, dn, dv, r, CudaBackend::W(w_kvb), bf16, CudaBackend::F(*o),
                     be_.stream_);
}

// Expanded prefill (spec §6.2, §6.4; issue 14). At the models' widths: every sequence's latent
// rows gathered from the codes where they lie (KvGather, F32: the expansion GEMM's input), one
// expansion GEMM per sequence (its bits a function of that sequence alone, whatever the batch)
// writing k_nope ‖ v in BF16 (GemmWBf16Out: no F32 copy of the history's keys and values), k_s
// rounded to BF16, and the flash-attention kernel over the whole batch.
// Other widths: each sequence through Gather + MlaAttention, the F32 path.
void CudaKvStorage::AttendPrefill(int layer, const PagedPrefill& batch, const Tensor& q, const Tensor& w_kvb,
                                  const MlaShape& shape, Tensor* o) {
  const int64_t B = batch.size(), H = shape.heads, dn = shape.nope_dim, dr = shape.rope_dim, dv = shape.v_dim,
                r = shape.latent_dim;
  KIMIRT_CHECK(r == s_.latent_dim && dr == s_.rope_dim && layer >= 0 && layer < s_.layers);
  const int64_t rows = q.dim(0);
  KIMIRT_CHECK(q.numel() == rows * H * (dn + dr) && o->numel() == rows * H * dv && w_kvb.dim(1) == r &&
               w_kvb.dim(0) == H * (dn + dv));
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = static_cast<size_t>(b);
    KIMIRT_CHECK_MSG(batch.start[i] >= 0 && batch.count[i] >= 0 && batch.row[i] >= 0 &&
                         batch.row[i] + batch.count[i] <= rows,
                     "prefill: rows out of range");
    KIMIRT_CHECK_MSG(static_cast<int64_t>(batch.table(b).size()) * s_.block_size >= batch.start[i] + batch.count[i],
                     "prefill: a block table does not cover its sequence");
  }
  if (!cuda::MlaPrefillSupported(dn, dr, dv)) {
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = static_cast<size_t>(b);
      const int64_t start = batch.start[i], n = batch.count[i];
      if (n == 0) continue;
      Tensor c = be_.Raw({start + n, r}, DType::kF32), ks = be_.Raw({start + n, dr}, DType::kF32);
      Gather(layer, batch.table(b), start + n, &c, &ks);
      Tensor out = o->Rows(batch.row[i], n);
      be_.MlaAttention(q.Rows(batch.row[i], n), c, ks, w_kvb, shape, start, MlaForm::kExpanded, &out);
    }
    return;
  }
  // The wgmma kernel for every call (kernels.h: the fastest shape at every length measured, from
  // 256-token chunks to a 32K prompt); the variants give every row the same bits, so
  // KIMIRT_MLA_PREFILL_VARIANT=v (read once) takes another for A/B runs without changing a result.
  static const int variant = [] {
    const char* v = std::getenv("KIMIRT_MLA_PREFILL_VARIANT");
    const int n = v == nullptr ? -1 : std::atoi(v);
    return n >= 0 && n < cuda::kMlaPrefillVariants ? n : cuda::kMlaPrefillDefaultVariant;
  }();
  const cuda::MlaPrefillPlan plan = cuda::PlanMlaPrefill(batch.start, batch.count, batch.row, variant);
  if (plan.num_tiles == 0) return;
  std::vector<int32_t> meta = plan.meta;
  const int64_t tables_at = static_cast<int64_t>(meta.size());
  meta.insert(meta.end(), batch.tables.begin(), batch.tables.end());
  Tensor d_meta = be_.UploadInts(meta);
  const int32_t* d_ints = static_cast<const int32_t*>(d_meta.raw());
  const int64_t width = H * (dn + dv);
  const float* scales = kind_ == 2 ? static_cast<const float*>(scales_.raw()) : nullptr;
  cuda::MlaPrefillArgs a = cuda::PlannedMlaPrefillArgs(plan, d_ints, H, dn, dr, dv);
  a.q = CudaBackend::F(q);
  a.o = CudaBackend::F(*o);
  // One sequence (every prefill call the model makes) whose earlier chunks' rows are still held:
  // expand only rows [reuse, len) into its buffer and attend over the buffer (its keys start at
  // row 0, as the one-sequence plan has them).
  ExpandedHistory* history = B == 1 && be_.ExpandsRowInvariantly(w_kvb) ? History(width, dr) : nullptr;
  if (history != nullptr) {
    const int64_t start = batch.start[0], len = start + batch.count[0];
    const ExpandedHistory::Plan p = history->Begin(layer, batch.table(0), start, len);
    Free(p.dropped);
    if (p.entry >= 0) {
      KIMIRT_CHECK(plan.key_begin[0] == 0);
      HistoryBuffer& buf = history_buffers_[static_cast<size_t>(p.entry)][static_cast<size_t>(layer)];
      if (buf.capacity < p.capacity) {
        HistoryBuffer grown{be_.Raw({p.capacity, width}, DType::kBF16),
                            be_.Raw({p.capacity, std::max<int64_t>(dr, 1)}, DType::kBF16), p.capacity};
        if (p.reuse > 0) {
          KIMIRT_CUDA_OK(cudaMemcpyAsync(grown.kv.raw(), buf.kv.raw(), static_cast<size_t>(p.reuse * width) * 2,
                                         cudaMemcpyDeviceToDevice, be_.stream_));
          if (dr > 0) {
            KIMIRT_CUDA_OK(cudaMemcpyAsync(grown.ks.raw(), buf.ks.raw(), static_cast<size_t>(p.reuse * dr) * 2,
                                           cudaMemcpyDeviceToDevice, be_.stream_));
          }
        }
        buf = std::move(grown);
      }
      const int64_t n = len - p.reuse;
      Tensor c = be_.Raw({n, r}, DType::kF32), ks = be_.Raw({n, dr}, DType::kF32);
      cuda::KvGather(values_.raw(), scales, p.reuse, len, r, dr, d_ints + tables_at, s_.layers, layer, s_.block_size,
                     kind_, CudaBackend::F(c), dr > 0 ? CudaBackend::F(ks) : nullptr, be_.stream_);
      be_.GemmWBf16Out(CudaBackend::F(c), w_kvb, static_cast<uint16_t*>(buf.kv.raw()) + p.reuse * width, n, width, r);
      if (dr > 0) {
        cuda::ToBf16(CudaBackend::F(ks), static_cast<uint16_t*>(buf.ks.raw()) + p.reuse * dr, n * dr, be_.stream_);
      }
      history->Filled(p.entry, layer, len);
      a.kv = buf.kv.raw();
      a.ks = dr > 0 ? buf.ks.raw() : nullptr;
      cuda::MlaPrefillAttention(a, be_.stream_);
      return;
    }
  }
  const int64_t keys = plan.keys;
  Tensor c = be_.Raw({keys, r}, DType::kF32), ks = be_.Raw({keys, dr}, DType::kF32);
  Tensor kv16 = be_.Raw({keys, width}, DType::kBF16), ks16 = be_.Raw({keys, dr}, DType::kBF16);
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = static_cast<size_t>(b);
    const int64_t len = batch.start[i] + batch.count[i], k0 = plan.key_begin[i];
    if (batch.count[i] == 0) continue;
    cuda::KvGather(values_.raw(), scales, 0, len, r, dr, d_ints + tables_at + batch.table_begin[i], s_.layers, layer,
                   s_.block_size, kind_, CudaBackend::F(c) + k0 * r, dr > 0 ? CudaBackend::F(ks) + k0 * dr : nullptr,
                   be_.stream_);
    be_.GemmWBf16Out(CudaBackend::F(c) + k0 * r, w_kvb, static_cast<uint16_t*>(kv16.raw()) + k0 * width, len, width,
                     r);
  }
  if (dr > 0) cuda::ToBf16(CudaBackend::F(ks), ks16.raw(), keys * dr, be_.stream_);
  a.kv = kv16.raw();
  a.ks = dr > 0 ? ks16.raw() : nullptr;
  cuda::MlaPrefillAttention(a, be_.stream_);
}

// The history keeper, made for the first row width it is asked for (a model's MLA layers share
// one); another width, or a cap of 0, gets none. The cap: the shape's, else
// KIMIRT_MLA_PREFILL_HISTORY_MB (0 turns it off, for A/B runs), else 1/32 of the device's memory
// (4.4 GB on an H200; a 32K prompt's history at Kimi-Linear-48B's widths is 512 MB a layer).
ExpandedHistory* CudaKvStorage::History(int64_t width, int64_t dr) {
  if (!history_) {
    int64_t cap = s_.prefill_history_bytes;
    const char* mb = std::getenv("KIMIRT_MLA_PREFILL_HISTORY_MB");
    if (cap < 0 && mb != nullptr) cap = std::max<int64_t>(0, std::atoll(mb)) << 20;
    if (cap < 0) {
      size_t free = 0, total = 0;
      KIMIRT_CUDA_OK(cudaMemGetInfo(&free, &total));
      cap = static_cast<int64_t>(total / 32);
    }
    if (cap == 0) return nullptr;
    constexpr int kEntries = 8;
    history_.emplace(s_.layers, s_.block_size, (width + dr) * 2, cap, kEntries);
    history_width_ = width;
    history_dr_ = dr;
    history_buffers_.assign(kEntries, std::vector<HistoryBuffer>(static_cast<size_t>(s_.layers)));
  }
  return width == history_width_ && dr == history_dr_ ? &*history_ : nullptr;
}

void CudaKvStorage::Free(const ExpandedHistory::Dropped& dropped) {
  for (auto [entry, layer] : dropped) history_buffers_[static_cast<size_t>(entry)][static_cast<size_t>(layer)] = {};
}

void CudaKvStorage::Released(std::span<const int32_t> blocks) {
  if (history_) Free(history_->Released(blocks));
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

void* CudaBackendStream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda == nullptr ? nullptr : cuda->stream();
}

Result<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Unsupported(std::string("no usable CUDA device: ") + cudaGetErrorString(e));
  }
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                           " visible)");
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return Internal(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  }
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return Internal(std::string("cudaStreamCreate: ") + cudaGetErrorString(e));
  }
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return Internal("cublasCreate failed");
  }
  // Plain FP32 (the default math mode uses no TF32), so GEMMs stay at FP32 rounding.
  cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH);
  cublasSetStream(blas, stream);
  return std::unique_ptr<Backend>(new CudaBackend(device, stream, blas));
}

}  // namespace kimirt
