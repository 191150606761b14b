// MakeNcclCommunicator where NCCL is not built (CPU builds, or a CUDA build without NCCL: the
// configure step says so); the real one is cuda/nccl_communicator.cu.
#include "kimirt/parallel/nccl_communicator.h"

#if !KIMIRT_HAVE_NCCL
namespace kimirt {

namespace {
Status NotBuilt() {
  return Unsupported("the NCCL communicator is not built: configure with -DKIMIRT_CUDA=ON where NCCL "
                     "(nccl.h, libnccl) is found");
}
}  // namespace

bool NcclCommunicatorBuilt() { return false; }

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(RendezvousStore&, const NcclOptions&) { return NotBuilt(); }

Status NcclSelfCheck(RendezvousStore&, int, size_t) { return NotBuilt(); }

Status PeerAllReduceSelfCheck(RendezvousStore&, int, size_t, int) { return NotBuilt(); }

Result<std::vector<AllReduceTiming>> NcclAllReduceBench(RendezvousStore&, int, const std::vector<size_t>&, int) {
  return NotBuilt();
}

}  // namespace kimirt
#endif
