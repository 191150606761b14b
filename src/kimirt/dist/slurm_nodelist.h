// The first host of a Slurm node list (SLURM_STEP_NODELIST / SLURM_JOB_NODELIST), which is where
// rank 0 runs under srun's default block distribution, so it is the rendezvous master.
// Handles Slurm's compressed form: "a01,b02", "node[001-004,7]", "n[1-2]-ib", "rack[1-2]-n[3-4]".
#pragma once

#include <string>
#include <string_view>

#include "kimirt/core/status.h"

namespace kimirt {

// "host[1-3,5],other" -> "host1"; zero padding is kept ("node[007-9]" -> "node007").
// Errors (naming the list): empty, unbalanced or nested brackets, an empty bracket group.
Result<std::string> FirstSlurmHost(std::string_view nodelist);

}  // namespace kimirt
