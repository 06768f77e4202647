// Planted-bug variants of the cpu-mma host model, for mutation testing only (`mlafuzz mutants`).
// Built into the separate target mlafuzz_host_mutants when MLAFUZZ_MUTANTS is ON;
// never part of a normal code path. The mechanics of every mutant are documented beside its
// `if constexpr` in kernels/host/host_pipeline.h and kernels/host/cpu_mma.h.
#pragma once

#include <memory>

#include "core/backend.h"
#include "mla/mutants.h"

namespace mlafuzz {

// Does the host model implement mutant m? Every catalogue entry except kNone, kMissingBarrier
// (a GPU race, no host analogue) and kCount.
bool host_mutant_supported(mla::Mutant m);

// "cpu-mma~<mutant_name>" (BLOCK_H 32). Returns nullptr when !host_mutant_supported(m).
std::unique_ptr<Backend> make_cpu_mma_mutant_backend(mla::Mutant m);

}  // namespace mlafuzz
