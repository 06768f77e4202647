// Parsing of campaign options: durations, shards (with the GoogleTest and Slurm environment
// variables), device lists. Errors are std::invalid_argument naming the bad value.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mlafuzz::campaign {

// "90s", "10m", "8h", "1d", "1h30m", "2.5h" or a plain number of seconds. Must be > 0.
double parse_duration(const std::string& text);

// Shard I of N: case number n of the shard is global case index n * count + index, so shards
// of one seed draw disjoint streams and every case is regenerated from (seed, global index).
struct ShardSpec {
  int32_t index = 0;
  int32_t count = 1;
  std::string source = "default";  // "--shard", "GTEST_*", "SLURM_ARRAY_*",
                                   // "JOB_COMPLETION_INDEX" or "default"
  uint64_t global_index(uint64_t case_number) const {
    return case_number * static_cast<uint64_t>(count) + static_cast<uint64_t>(index);
  }
};

// "I/N" with 0 <= I < N.
ShardSpec parse_shard(const std::string& text);

// The shard from --shard when given, else GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS, else
// SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (task ids relative to SLURM_ARRAY_TASK_MIN when
// set), else JOB_COMPLETION_INDEX/MLAFUZZ_SHARD_COUNT (a Kubernetes Indexed Job: the index is
// Kubernetes', the count the manifest's; an index without a count is an error), else 0/1.
// `getenv` is injectable for tests.
ShardSpec resolve_shard(const std::optional<std::string>& flag,
                        const std::function<const char*(const char*)>& getenv_fn);

// --devices: "all" (every device the machine has), "N" (the first N), or a list "0,2,3".
// Returns device ordinals; `available` is the machine's device count. "none" or "0" gives {}.
std::vector<int> parse_devices(const std::string& text, int available);

}  // namespace mlafuzz::campaign
