// Helpers shared by the harness tests.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/case.h"
#include "core/settings.h"

namespace mlafuzz::testing {

// A small MODEL1 case that materializes in microseconds but still has several pages, tiles and
// heads, so addressing and tiling mistakes show.
inline Case small_case() {
  Case c;
  c.name = "small";
  c.geom.page_size = 5;
  c.geom.num_pages = 3;
  c.batch = 2;
  c.heads = 3;
  c.topk = 7;
  c.data_seed = 42;
  return c;
}

// `quick` where MLAFUZZ_TEST_QUICK=1 (the sanitized run, scripts/sanitize.sh), else `full`: for
// the tests whose time goes into volume (generated cases, campaign lengths, corpus sizes) over
// code paths that a smaller volume takes too. docs/testing.md, "Sanitized build", lists them.
template <typename T>
T full_or_quick(T full, T quick) {
  return settings::flag("MLAFUZZ_TEST_QUICK", false) ? quick : full;
}

// A fresh, empty folder under the system temp folder; removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mlafuzz-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace mlafuzz::testing
