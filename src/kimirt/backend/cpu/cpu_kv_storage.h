// The CPU backend's latent cache storage (backend.h KvStorage) in host memory.
#pragma once

#include <memory>

#include "kimirt/backend/backend.h"

namespace kimirt {

std::unique_ptr<KvStorage> MakeCpuKvStorage(const KvStorageShape& shape);

}  // namespace kimirt
