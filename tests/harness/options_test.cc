// Durations, shards (flags and environment), devices; shard streams disjoint and reproducible.
#include "harness/campaign/options.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <stdexcept>

#include "core/case.h"
#include "core/fileio.h"
#include "harness/campaign/campaign.h"
#include "properties/generate.h"
#include "tests/core/build_paths.h"

namespace mlafuzz::campaign {
namespace {

TEST(Duration, ParsesUnitsAndSums) {
  EXPECT_DOUBLE_EQ(parse_duration("90s"), 90);
  EXPECT_DOUBLE_EQ(parse_duration("10m"), 600);
  EXPECT_DOUBLE_EQ(parse_duration("8h"), 8 * 3600);
  EXPECT_DOUBLE_EQ(parse_duration("1d"), 86400);
  EXPECT_DOUBLE_EQ(parse_duration("1h30m"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("2.5h"), 9000);
  EXPECT_DOUBLE_EQ(parse_duration("45"), 45);
}

TEST(Duration, RejectsBadText) {
  for (const char* bad : {"", "abc", "10x", "0s", "1h30", "h", "-5s", "1..2s"}) {
    EXPECT_THROW(parse_duration(bad), std::invalid_argument) << bad;
  }
  try {
    parse_duration("10x");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("10x"), std::string::npos) << e.what();
  }
}

TEST(Shard, ParsesAndRejects) {
  const ShardSpec s = parse_shard("2/5");
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 5);
  EXPECT_EQ(s.global_index(0), 2u);
  EXPECT_EQ(s.global_index(3), 17u);
  for (const char* bad : {"5/5", "-1/3", "1/0", "1", "a/b", "1/2/3", ""}) {
    EXPECT_THROW(parse_shard(bad), std::invalid_argument) << bad;
  }
}

std::function<const char*(const char*)> env(std::map<std::string, std::string> vars) {
  auto store = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [store](const char* n) -> const char* {
    auto it = store->find(n);
    return it == store->end() ? nullptr : it->second.c_str();
  };
}

TEST(Shard, EnvironmentVariables) {
  ShardSpec s = resolve_shard(std::nullopt, env({}));
  EXPECT_EQ(s.index, 0);
  EXPECT_EQ(s.count, 1);
  s = resolve_shard(std::nullopt, env({{"GTEST_SHARD_INDEX", "1"}, {"GTEST_TOTAL_SHARDS", "3"}}));
  EXPECT_EQ(s.index, 1);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.source, "GTEST_*");
  s = resolve_shard(std::nullopt, env({{"SLURM_ARRAY_TASK_ID", "7"},
                                       {"SLURM_ARRAY_TASK_COUNT", "4"},
                                       {"SLURM_ARRAY_TASK_MIN", "5"}}));
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.source, "SLURM_ARRAY_*");
  // --shard wins over the environment.
  s = resolve_shard(std::string("0/2"),
                    env({{"GTEST_SHARD_INDEX", "1"}, {"GTEST_TOTAL_SHARDS", "3"}}));
  EXPECT_EQ(s.count, 2);
  EXPECT_THROW(
      resolve_shard(std::nullopt, env({{"GTEST_SHARD_INDEX", "3"}, {"GTEST_TOTAL_SHARDS", "3"}})),
      std::invalid_argument);
  EXPECT_THROW(resolve_shard(std::nullopt,
                             env({{"SLURM_ARRAY_TASK_ID", "x"}, {"SLURM_ARRAY_TASK_COUNT", "3"}})),
               std::invalid_argument);
}

TEST(Shard, KubernetesIndexedJob) {
  ShardSpec s = resolve_shard(std::nullopt,
                              env({{"JOB_COMPLETION_INDEX", "3"}, {"MLAFUZZ_SHARD_COUNT", "8"}}));
  EXPECT_EQ(s.index, 3);
  EXPECT_EQ(s.count, 8);
  EXPECT_EQ(s.source, "JOB_COMPLETION_INDEX");
  // An index without the count would make every pod shard 0 of 1: the same cases everywhere.
  try {
    resolve_shard(std::nullopt, env({{"JOB_COMPLETION_INDEX", "3"}}));
    ADD_FAILURE() << "an index without a count was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("needs MLAFUZZ_SHARD_COUNT"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(resolve_shard(std::nullopt,
                             env({{"JOB_COMPLETION_INDEX", "8"}, {"MLAFUZZ_SHARD_COUNT", "8"}})),
               std::invalid_argument);
  // --shard wins over the environment.
  s = resolve_shard(std::string("1/2"),
                    env({{"JOB_COMPLETION_INDEX", "3"}, {"MLAFUZZ_SHARD_COUNT", "8"}}));
  EXPECT_EQ(s.count, 2);
}

// The example manifest's numbers agree: completions = parallelism = the shard count mlafuzz
// reads = the shards the merge waits for; each pod resumes its shard.
TEST(Shard, KubernetesManifestVariablesAgree) {
  const std::string manifest = std::string(mlafuzz::build_paths::kSourceDir) +
                               "/examples/kubernetes/nightly-indexed-job.yaml";
  const std::string text = read_file(manifest);
  auto number = [&](const std::string& pattern) {
    std::smatch m;
    const std::regex re(pattern);
    if (!std::regex_search(text, m, re)) {
      ADD_FAILURE() << "no match for " << pattern << " in " << manifest;
      return -1;
    }
    return std::stoi(m[1].str());
  };
  const int completions = number(R"(\n  completions: (\d+))");
  EXPECT_GT(completions, 1);
  EXPECT_EQ(number(R"(\n  parallelism: (\d+))"), completions);
  EXPECT_EQ(number(R"re(name: MLAFUZZ_SHARD_COUNT\s+value: "(\d+)")re"), completions);
  EXPECT_EQ(number(R"re(name: SHARDS\s+value: "(\d+)")re"), completions);
  EXPECT_NE(text.find("completionMode: Indexed"), std::string::npos);
  EXPECT_NE(text.find("mlafuzz fuzz --resume"), std::string::npos);
  EXPECT_NE(text.find("shard-$JOB_COMPLETION_INDEX"), std::string::npos);
  std::set<uint64_t> seen;
  for (int i = 0; i < completions; ++i) {
    const ShardSpec s =
        resolve_shard(std::nullopt, env({{"JOB_COMPLETION_INDEX", std::to_string(i)},
                                         {"MLAFUZZ_SHARD_COUNT", std::to_string(completions)}}));
    EXPECT_EQ(s.index, i);
    for (uint64_t n = 0; n < 4; ++n) EXPECT_TRUE(seen.insert(s.global_index(n)).second);
  }
  EXPECT_EQ(seen.size(), 4u * completions);
  EXPECT_EQ(*seen.rbegin(), 4u * completions - 1);  // every global index below, none twice
}

TEST(Shard, StreamsAreDisjointAndCoverEveryIndex) {
  for (int n : {1, 2, 3, 7}) {
    std::set<uint64_t> seen;
    for (int i = 0; i < n; ++i) {
      const ShardSpec s = parse_shard(std::to_string(i) + "/" + std::to_string(n));
      for (uint64_t k = 0; k < 50; ++k) {
        EXPECT_TRUE(seen.insert(s.global_index(k)).second) << "index repeated";
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(50 * n));
    EXPECT_EQ(*seen.rbegin(), static_cast<uint64_t>(50 * n - 1));
  }
}

TEST(Shard, CasesAreReproducibleFromSeedAndIndex) {
  const GenConfig cfg = gen_config_for_profile("default");
  const ShardSpec s = parse_shard("1/4");
  for (uint64_t k = 0; k < 10; ++k) {
    std::vector<std::string> t1, t2;
    const Case a = generate_case(99, s.global_index(k), cfg, &t1);
    const Case b = generate_case(99, s.global_index(k), cfg, &t2);
    EXPECT_EQ(to_json(a), to_json(b));
    EXPECT_EQ(t1, t2);
  }
  // Other shards draw other cases.
  const Case x = generate_case(99, parse_shard("0/4").global_index(0), cfg, nullptr);
  const Case y = generate_case(99, s.global_index(0), cfg, nullptr);
  EXPECT_NE(to_json(x), to_json(y));
}

TEST(Profile, KnownAndUnknown) {
  EXPECT_TRUE(gen_config_for_profile("default").families.empty());
  EXPECT_EQ(gen_config_for_profile("production").families, std::vector<std::string>{"production"});
  EXPECT_THROW(gen_config_for_profile("nightly"), std::invalid_argument);
}

TEST(Devices, Parses) {
  EXPECT_EQ(parse_devices("all", 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(parse_devices("2", 3), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_devices("2,0", 3), (std::vector<int>{2, 0}));
  EXPECT_TRUE(parse_devices("none", 3).empty());
  EXPECT_THROW(parse_devices("4", 3), std::invalid_argument);
  EXPECT_THROW(parse_devices("0,3", 3), std::invalid_argument);
  EXPECT_THROW(parse_devices("0,0", 3), std::invalid_argument);
  EXPECT_THROW(parse_devices("gpu0", 3), std::invalid_argument);
}

}  // namespace
}  // namespace mlafuzz::campaign
