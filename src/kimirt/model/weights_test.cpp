// Loading MXFP4 routed experts (spec §2.9) from make-checkpoint-written checkpoints of the tiny
// K3 fixture config (tiny-a: 8 experts of 32 × 32, codes + scales): a good one loads on the CPU
// with each expert widened to exactly its dequantized values; a broken one (a scale tensor of the
// wrong shape, codes of the wrong length, an expert without its scales) is a load error that
// names the tensor, on the GPU too, where a failed load leaves no device memory behind. And the
// router: widened to F32 on the CPU, held as stored (BF16) on the GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/io/safetensors.h"
#include "kimirt/model/config.h"
#include "kimirt/model/weights.h"
#include "kimirt/testing/test_data.h"
#include "kimirt/tools/checkpoint_writer.h"

namespace kimirt {
namespace {

const std::string kExpert = "language_model.model.layers.1.block_sparse_moe.experts.3.";
using Edit = std::function<bool(const TensorSpec&, Shape*, std::vector<uint8_t>*)>;
// Every tensor as written, unchanged.
const Edit kKeepAll = [](const TensorSpec&, Shape*, std::vector<uint8_t>*) { return true; };

class Mxfp4LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string config = testing::FixtureDir("tiny-a") + "/config.json";
    KIMIRT_REQUIRE_FILE(config);
    auto c = LoadModelConfig(config);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_TRUE(c->quantization.routed_experts_mxfp4);
    auto l = Layout::Build(*c);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    layout_.emplace(std::move(l).value());
    dir_ = ::testing::TempDir() + "kimirt_mxfp4_load_" + std::to_string(::getpid());
    cpu_ = std::move(MakeBackend("cpu")).value();
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // The config's random checkpoint (make-checkpoint --random's bytes), one shard, with `edit`
  // applied to each tensor first (it may change the shape and bytes; false drops the tensor).
  Result<ModelWeights> WriteAndLoad(const Edit& edit, Backend* be = nullptr) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    SafetensorsWriter w;
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<std::pair<std::string, std::string>> map;
    uint64_t total = 0;
    buffers.reserve(layout_->tensors().size());
    for (const TensorSpec& t : layout_->tensors()) {
      Shape shape = t.shape;
      std::vector<uint8_t> bytes = RandomTensorBytes(*layout_, t, 5);
      if (!edit(t, &shape, &bytes)) continue;
      total += bytes.size();
      buffers.push_back(std::move(bytes));
      w.Add(t.name, t.dtype, shape, buffers.back());
      map.emplace_back(t.name, "model.safetensors");
    }
    KIMIRT_RETURN_IF_ERROR(w.Write(dir_ + "/model.safetensors"));
    KIMIRT_RETURN_IF_ERROR(WriteSafetensorsIndex(dir_, map, total));
    KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir_));
    return LoadModelWeights(*layout_, *CheckpointWeightSource(*ckpt), 1, 0, be != nullptr ? *be : *cpu_);
  }

  // The load fails and its message names `name`.
  void ExpectErrorNaming(const Edit& edit, const std::string& name, Backend* be = nullptr) {
    Result<ModelWeights> r = WriteAndLoad(edit, be);
    ASSERT_FALSE(r.ok()) << "a checkpoint with " << name << " broken loaded";
    EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().ToString();
  }

  // Layer 1's router as WriteAndLoad stores it (BF16 bytes).
  std::vector<uint8_t> StoredRouterBytes() const {
    const TensorSpec* t = layout_->Find("language_model.model.layers.1.block_sparse_moe.gate.weight");
    EXPECT_NE(t, nullptr);
    return t != nullptr ? RandomTensorBytes(*layout_, *t, 5) : std::vector<uint8_t>{};
  }

  std::optional<Layout> layout_;
  std::string dir_;
  std::unique_ptr<Backend> cpu_;
};

TEST_F(Mxfp4LoadTest, CpuWidensEachExpertToItsDequantizedValues) {
  Result<ModelWeights> w = WriteAndLoad(kKeepAll);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ExpertWeights& ex = w->layers[1].moe.experts;
  ASSERT_FALSE(ex.mxfp4());
  const TensorSpec* codes = layout_->Find(kExpert + "w2.weight_packed");
  const TensorSpec* scales = layout_->Find(kExpert + "w2.weight_scale");
  ASSERT_NE(codes, nullptr);
  ASSERT_NE(scales, nullptr);
  const std::vector<uint8_t> c = RandomTensorBytes(*layout_, *codes, 5), s = RandomTensorBytes(*layout_, *scales, 5);
  const int64_t rows = codes->shape[0], cols = codes->shape[1] * 2;
  const Tensor& down = ex.down[3];
  ASSERT_EQ(down.shape(), (Shape{rows, cols}));
  std::vector<float> want(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeMxfp4Row(c.data() + r * cols / 2, s.data() + r * cols / 32, cols, want.data());
    for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(down.f32()[r * cols + i], want[static_cast<size_t>(i)]) << r << "," << i;
  }
}

// The loader marks each MoE layer's experts with the config's routed load (light_load: the CUDA
// decode's part columns), K3's 16 of 896 light and Kimi-Linear-48B's 8 of 256 not, from the
// published configs.
TEST_F(Mxfp4LoadTest, ExpertsCarryTheConfigsRoutedLoad) {
  const auto moe_layers_light = [&]() -> std::vector<bool> {
    Result<ModelWeights> w = WriteAndLoad(kKeepAll);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    std::vector<bool> light;
    if (!w.ok()) return light;
    for (const LayerWeights& l : w->layers) {
      if (!l.moe.experts.gate.empty()) light.push_back(l.moe.experts.light_load);
    }
    return light;
  };
  const std::vector<bool> tiny = moe_layers_light();  // tiny-a: 2 of 8 experts
  ASSERT_FALSE(tiny.empty());
  for (const bool l : tiny) EXPECT_FALSE(l);
  ModelConfig c = layout_->config();  // 1 of 48: light
  c.num_experts = 48;
  c.num_experts_per_token = 1;
  auto l = Layout::Build(c);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  layout_.emplace(std::move(l).value());
  const std::vector<bool> light = moe_layers_light();
  ASSERT_EQ(light.size(), tiny.size());
  for (const bool b : light) EXPECT_TRUE(b);
  for (const auto& [name, light] : {std::pair{"kimi-k3.json", true}, std::pair{"kimi-linear-48b-a3b.json", false}}) {
    const std::string path = testing::TestDataPath(std::string("configs/") + name);
    KIMIRT_REQUIRE_FILE(path);
    auto pc = LoadModelConfig(path);
    ASSERT_TRUE(pc.ok()) << pc.status().ToString();
    EXPECT_EQ(LightRoutedLoad(pc->num_experts_per_token, pc->num_experts), light) << name;
  }
}

// The three broken checkpoints: each the edit that breaks it and the tensor its error names.
struct Breakage {
  std::string name;
  Edit edit;
};
Breakage ScaleOfTheWrongShape() {
  const std::string name = kExpert + "w1.weight_scale";
  return {name, [name](const TensorSpec& t, Shape* shape, std::vector<uint8_t>* bytes) {
            if (t.name == name) {
              (*shape)[1] += 1;  // one scale group too many per row
              bytes->assign(static_cast<size_t>(NumElements(*shape)), 127);
            }
            return true;
          }};
}
Breakage CodesOfTheWrongLength() {
  const std::string name = kExpert + "w2.weight_packed";
  return {name, [name](const TensorSpec& t, Shape* shape, std::vector<uint8_t>* bytes) {
            if (t.name == name) {
              (*shape)[1] -= 1;  // a byte (two codes) short per row
              bytes->resize(static_cast<size_t>(NumElements(*shape)));
            }
            return true;
          }};
}
Breakage ExpertWithoutItsScales() {
  const std::string name = kExpert + "w3.weight_scale";
  return {name, [name](const TensorSpec& t, Shape*, std::vector<uint8_t>*) { return t.name != name; }};
}

TEST_F(Mxfp4LoadTest, ScaleTensorOfTheWrongShapeNamesIt) {
  const Breakage b = ScaleOfTheWrongShape();
  ExpectErrorNaming(b.edit, b.name);
}

TEST_F(Mxfp4LoadTest, CodesOfTheWrongLengthNameThem) {
  const Breakage b = CodesOfTheWrongLength();
  ExpectErrorNaming(b.edit, b.name);
}

TEST_F(Mxfp4LoadTest, ExpertWithoutItsScalesNamesThem) {
  const Breakage b = ExpertWithoutItsScales();
  ExpectErrorNaming(b.edit, b.name);
}

// The router (gate.weight, stored BF16): widened to F32 at load on the CPU, whose router math is
// F32 on F32 weights (Backend::RouterAsStored false); the values are the stored ones.
TEST_F(Mxfp4LoadTest, RouterIsWidenedOnTheCpu) {
  Result<ModelWeights> w = WriteAndLoad(kKeepAll);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const std::vector<uint8_t> stored = StoredRouterBytes();
  const Tensor& r = w->layers[1].moe.router;
  ASSERT_EQ(r.dtype(), DType::kF32);
  ASSERT_EQ(static_cast<size_t>(r.numel()) * 2, stored.size());
  for (int64_t i = 0; i < r.numel(); ++i) {
    uint16_t b = 0;
    std::memcpy(&b, stored.data() + 2 * i, 2);
    ASSERT_EQ(r.f32()[i], Bf16ToF32(b)) << "element " << i;
  }
}

#if KIMIRT_TEST_CUDA
// On the GPU the same checkpoints are the same load errors, and a failed load leaves nothing
// allocated: the weights loaded before the broken tensor go into slabs (Backend::BeginWeights),
// freed with their last tensor when the load gives up, so by the driver's count (cudaMemGetInfo)
// every failed load after the first (which may leave the backend's own buffers behind) returns
// the device's free memory to what it was before it.
class CudaMxfp4LoadTest : public Mxfp4LoadTest {};

TEST_F(CudaMxfp4LoadTest, FailedLoadsLeaveNothingAllocated) {
  auto gpu = MakeBackend("cuda");
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  const Breakage breakages[] = {ScaleOfTheWrongShape(), CodesOfTheWrongLength(), ExpertWithoutItsScales()};
  for (const Breakage& b : breakages) ExpectErrorNaming(b.edit, b.name, gpu->get());
  for (const Breakage& b : breakages) {
    SCOPED_TRACE(b.name);
    const std::optional<Backend::MemoryInfo> before = (*gpu)->DeviceMemory();
    ASSERT_TRUE(before.has_value());
    ExpectErrorNaming(b.edit, b.name, gpu->get());
    const std::optional<Backend::MemoryInfo> after = (*gpu)->DeviceMemory();
    ASSERT_TRUE(after.has_value());
    EXPECT_EQ(after->free, before->free) << "a failed load left device memory allocated";
  }
}

// On the GPU the router stays as stored (Backend::RouterAsStored): BF16, the checkpoint's bytes,
// half of what the F32 copy took (the CUDA router math widens it: CudaBackendMoe.
// Bf16RouterGivesTheF32RoutersChoices).
TEST_F(CudaMxfp4LoadTest, RouterIsHeldAsStoredOnTheGpu) {
  auto gpu = MakeBackend("cuda");
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  ASSERT_TRUE((*gpu)->RouterAsStored());
  Result<ModelWeights> w = WriteAndLoad(kKeepAll, gpu->get());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const std::vector<uint8_t> stored = StoredRouterBytes();
  const Tensor& r = w->layers[1].moe.router;
  ASSERT_EQ(r.dtype(), DType::kBF16);
  const Tensor h = (*gpu)->Download(r);
  ASSERT_EQ(static_cast<size_t>(h.nbytes()), stored.size());
  EXPECT_EQ(std::memcmp(h.raw(), stored.data(), stored.size()), 0);
}
#endif

}  // namespace
}  // namespace kimirt
