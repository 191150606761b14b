#include "kimirt/tools/checkpoint_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"
#include "kimirt/io/safetensors.h"

namespace kimirt {
namespace {

// Bell-shaped test weights (SplitMix64::FastNormal) with the scales the reference fixtures use
// (fixtures/*/README.md), so activations stay O(1) through a random model.
void FillFloats(const Layout& layout, const TensorSpec& t, std::string_view stream_name, uint64_t seed,
                int64_t fan_in, std::vector<float>* out) {
  const ModelConfig& c = layout.config();
  SplitMix64 rng(seed ^ HashName(stream_name));
  const size_t count = out->size();
  using R = TensorRole;
  const TensorRole role = t.role;
  auto normal = [&](double stddev, double mean = 0.0) {
    const float m = static_cast<float>(mean), sd = static_cast<float>(stddev);
    for (size_t i = 0; i < count; ++i) (*out)[i] = m + sd * rng.FastNormal();
  };
  if (role == R::kKdaALog) {
    // log(U(1, 16)) for the real heads; K3's zero padding after them (spec §2.4).
    const int64_t heads = c.linear_attn.num_heads;
    for (size_t i = 0; i < count; ++i) {
      (*out)[i] = static_cast<int64_t>(i) < heads ? static_cast<float>(std::log(1.0 + 15.0 * rng.Uniform())) : 0.0f;
    }
  } else if (role == R::kKdaDtBias) {
    // The Mamba-style init FLA's KDA layer uses: dt log-uniform in [1e-3, 1e-1], dt_bias its
    // inverse softplus, so softplus(f + dt_bias) starts near dt. N(0, 0.1) gave softplus ≈ 0.7,
    // decays of up to −11 a token (α = −exp(A_log)·softplus, spec §5.3, no lower bound for
    // Kimi-Linear) that no trained model has, which sent the chunked kernel to its exact
    // token-by-token fallback: 58% of an 8K prefill of the 2-layer 48B (ncu, 2026-12-01).
    for (size_t i = 0; i < count; ++i) {
      const double dt = std::max(1e-4, std::exp(std::log(1e-3) + rng.Uniform() * (std::log(1e-1) - std::log(1e-3))));
      (*out)[i] = static_cast<float>(dt + std::log(-std::expm1(-dt)));
    }
  } else if (role == R::kKdaConvQ || role == R::kKdaConvK || role == R::kKdaConvV) {
    normal(0.5);
  } else if (role == R::kRouterBias) {
    normal(0.01);
  } else if (t.category == Category::kNorm) {
    normal(0.1, 1.0);
  } else if (role == R::kEmbed) {
    normal(1.0);
  } else if (role == R::kRouter) {
    normal(2.5 / std::sqrt(static_cast<double>(fan_in)));  // router: decisive top-k margins
  } else if (role == R::kKdaDecayB) {
    normal(0.3 / std::sqrt(static_cast<double>(fan_in)));
  } else if (role == R::kVisionPatchProj || role == R::kVisionPosEmb) {
    normal(0.02);
  } else {
    normal(1.0 / std::sqrt(static_cast<double>(fan_in)));
  }
}

}  // namespace

std::vector<uint8_t> RandomTensorBytes(const Layout& layout, const TensorSpec& t, uint64_t seed) {
  const int64_t n = NumElements(t.shape);
  std::vector<uint8_t> bytes(static_cast<size_t>(t.nbytes()));
  const bool packed = IsMxfp4Codes(t.role);
  const bool scale = IsMxfp4Scales(t.role);
  if (packed || scale) {
    // Random weights at MXFP4's own resolution, so multi-GB expert sets (K3: 30 G values a layer)
    // are written in seconds: codes are random bytes (every E2M1 code equally likely, mean square
    // 68.5/8), and each group's scale is one of two neighbouring powers of two, the upper with the
    // probability that makes the decoded matrix's standard deviation 1/sqrt(fan_in), like every
    // other weight (spec §2.9 for the format).
    SplitMix64 rng(seed ^ HashName(t.name));
    if (packed) {
      for (size_t i = 0; i < bytes.size(); i += 8) {
        const uint64_t r = rng.Next();
        std::memcpy(bytes.data() + i, &r, std::min<size_t>(8, bytes.size() - i));
      }
      return bytes;
    }
    const double fan_in = static_cast<double>(t.shape[1] * kMxfp4GroupSize);
    const double code_ms = 68.5 / 8.0, want_ms = 1.0 / fan_in;
    const int low = static_cast<int>(std::floor(0.5 * std::log2(want_ms / code_ms)));
    const double upper = (want_ms / (code_ms * std::ldexp(1.0, 2 * low)) - 1.0) / 3.0;  // in [0, 1)
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(127 + low + (rng.Uniform() < upper ? 1 : 0));
    return bytes;
  }
  std::vector<float> values(static_cast<size_t>(n));
  const int64_t fan_in = t.shape.size() >= 2 ? t.shape.back() : 1;
  FillFloats(layout, t, t.name, seed, fan_in, &values);
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(bytes.data(), values.data(), bytes.size());
      break;
    case DType::kBF16: {
      std::vector<uint16_t> h(static_cast<size_t>(n));
      F32ToBf16(values.data(), h.data(), static_cast<size_t>(n));
      std::memcpy(bytes.data(), h.data(), bytes.size());
      break;
    }
    default:
      // The layout only has BF16, F32 and MXFP4 U8 tensors; anything else stays zero.
      break;
  }
  return bytes;
}

Result<CheckpointWriteSummary> WriteCheckpoint(const Layout& layout, const std::string& out_dir,
                                               const CheckpointWriteOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IoError(out_dir + ": cannot create directory: " + ec.message());

  const uint64_t total = layout.total_bytes();
  int shards = options.shards;
  if (shards <= 0) {
    const uint64_t per = uint64_t{16} << 30;
    shards = static_cast<int>(std::max<uint64_t>(1, (total + per - 1) / per));
  }
  if (static_cast<size_t>(shards) > layout.size()) shards = static_cast<int>(layout.size());

  // Fill shards in layout order; shard k ends once the running total passes (k+1)/shards of
  // the bytes, so shards are near-equal in size, as HF's writer makes them.
  std::vector<std::pair<std::string, std::string>> weight_map;
  weight_map.reserve(layout.size());
  const std::vector<TensorSpec>& tensors = layout.tensors();
  size_t next = 0;
  uint64_t written = 0;
  CheckpointWriteSummary summary;
  for (int k = 0; k < shards; ++k) {
    char fname[64];
    std::snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", k + 1, shards);
    const uint64_t target = static_cast<uint64_t>(
        static_cast<long double>(total) * (k + 1) / static_cast<long double>(shards));
    SafetensorsWriter writer;
    writer.SetMetadata("format", "pt");
    std::vector<std::vector<uint8_t>> buffers;
    // Leave at least one tensor for each remaining shard.
    const size_t must_leave = static_cast<size_t>(shards - k - 1);
    while (next < tensors.size() && tensors.size() - next > must_leave &&
           (writer.size() == 0 || written < target || k == shards - 1)) {
      const TensorSpec& t = tensors[next++];
      if (options.fill == CheckpointFill::kRandom) {
        buffers.push_back(RandomTensorBytes(layout, t, options.seed));
        writer.Add(t.name, t.dtype, t.shape, buffers.back());
      } else {
        writer.Add(t.name, t.dtype, t.shape);
      }
      weight_map.emplace_back(t.name, fname);
      written += t.nbytes();
    }
    KIMIRT_RETURN_IF_ERROR(
        writer.Write(out_dir + "/" + fname, options.fill == CheckpointFill::kSparse));
    summary.tensors += static_cast<int64_t>(writer.size());
    if (options.progress) options.progress(k + 1, shards);
  }
  KIMIRT_RETURN_IF_ERROR(WriteSafetensorsIndex(out_dir, weight_map, total));
  if (!options.config_json.empty()) {
    std::ofstream cfg(out_dir + "/config.json", std::ios::binary);
    cfg << options.config_json;
    if (!cfg) return IoError(out_dir + "/config.json: write failed");
  }
  summary.shards = shards;
  summary.bytes = total;
  return summary;
}

}  // namespace kimirt
