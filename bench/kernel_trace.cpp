// Each CUDA kernel's start and end on the GPU, kernels inside CUDA graphs included: a CUPTI
// injection library, loaded by the CUDA driver into any program (kimirt, a bench) when
//   CUDA_INJECTION64_PATH=/path/libkimirt_kernel_trace.so KIMIRT_KERNEL_TRACE=out.csv <program>
// and written to out.csv when the program exits. scripts/kernel_trace_summary.py reads it.
//
// Why (issue 12): a decode step is a CUDA graph of ~40 kernels (the 2-layer Kimi-Linear-48B) to
// ~500 (the whole 48B) launched with programmatic dependent launch, so a kernel may start while
// the one before it runs. Nsight Compute times kernels one at a time (serialized, none of that
// overlap), and Nsight Systems does not run on the GPU machines (KINDS.md), so where a batch-1
// step's time goes between its weight GEMMs — the small kernels, the gaps, the overlap PDL buys —
// was not measured. CUPTI's concurrent-kernel records carry each kernel's GPU start and end and,
// for a graph's kernels, the graph and the graphLaunch call they came from (the correlation id):
// one row a kernel, grouped by the script into replays.
//
// Columns: start_ns, end_ns, stream, graph_id, correlation_id, blocks, threads_per_block,
// registers, dynamic_shared_bytes, name (demangled; commas replaced so the CSV stays simple).
// Copies and memsets (graph nodes too, and never PDL-overlapped) are rows named
// "[memcpy kind K N B]" and "[memset N B]" with zero grid columns.
#include <cuda.h>
#include <cupti.h>

#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;  // a CUPTI record buffer (records of ~200 bytes)

struct Row {
  uint64_t start, end;
  uint32_t stream, graph, correlation;
  int64_t blocks;
  int32_t threads;
  uint16_t registers;
  int32_t dynamic_smem;
  std::string name;
};

std::mutex g_mutex;
std::vector<Row>* g_rows = nullptr;  // never freed: the exit handler may run after static destructors

void Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kimirt kernel trace: %s failed: %s\n", what, msg ? msg : "?");
}

std::string Demangled(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  for (char& c : s) {
    if (c == ',' || c == '\n') c = ';';
  }
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<Row> rows;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      rows.push_back(Row{k->start, k->end, k->streamId, k->graphId, k->correlationId,
                         int64_t{k->gridX} * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                         k->registersPerThread, k->dynamicSharedMemory, Demangled(k->name)});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {  // copies are graph nodes too
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      rows.push_back(Row{m->start, m->end, m->streamId, m->graphId, m->correlationId, 0, 0, 0, 0,
                         "[memcpy kind " + std::to_string(m->copyKind) + " " + std::to_string(m->bytes) + " B]"});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      rows.push_back(Row{m->start, m->end, m->streamId, m->graphId, m->correlationId, 0, 0, 0, 0,
                         "[memset " + std::to_string(m->bytes) + " B]"});
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_rows->insert(g_rows->end(), rows.begin(), rows.end());
}

void WriteAtExit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("KIMIRT_KERNEL_TRACE");
  if (path == nullptr || *path == '\0') path = "kernel_trace.csv";
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kimirt kernel trace: cannot write %s\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(f, "start_ns,end_ns,stream,graph_id,correlation_id,blocks,threads_per_block,registers,dynamic_shared_bytes,name\n");
  for (const Row& r : *g_rows) {
    std::fprintf(f, "%llu,%llu,%u,%u,%u,%lld,%d,%u,%d,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.stream, r.graph, r.correlation,
                 static_cast<long long>(r.blocks), r.threads, r.registers, r.dynamic_smem, r.name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "kimirt kernel trace: %zu kernels to %s\n", g_rows->size(), path);
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library (CUPTI's injection
// entry point); 1 on success.
extern "C" int InitializeInjection(void) {
  g_rows = new std::vector<Row>();
  Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "cuptiActivityRegisterCallbacks");
  // The concurrent kind: kernels keep running as the program launches them (the plain kernel
  // kind would serialize them, hiding the overlap this is for).
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(memcpy)");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable(memset)");
  std::atexit(WriteAtExit);
  return 1;
}
