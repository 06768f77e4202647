// The benches' fixed case set (see case_set.h).
#include "bench/common/case_set.h"

#include <malloc.h>

#include "properties/generate.h"

namespace mlafuzz::bench {

void add_case_set_options(CLI::App& app, CaseSetArgs& args) {
  app.add_option("--seed", args.seed, "generator seed")->capture_default_str();
  app.add_option("--cases", args.cases, "the first N generated cases")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--profile", args.profile, "default, or production shapes only")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "production"}));
  app.add_option("--repeats", args.repeats, "repeats (the fastest is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

std::optional<int> parse_args(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

void use_campaign_allocator() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

std::vector<Case> generated_cases(const CaseSetArgs& args) {
  GenConfig cfg;
  if (args.profile == "production") cfg.families = {"production"};
  std::vector<Case> cs;
  for (int i = 0; i < args.cases; ++i) {
    cs.push_back(generate_case(args.seed, static_cast<uint64_t>(i), cfg, nullptr));
  }
  return cs;
}

}  // namespace mlafuzz::bench
