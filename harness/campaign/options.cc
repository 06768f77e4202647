#include "harness/campaign/options.h"

#include <cctype>
#include <cstdlib>
#include <stdexcept>

namespace mlafuzz::campaign {
namespace {

bool parse_int(const std::string& s, long long& out) {
  if (s.empty()) return false;
  size_t i = 0;
  if (s[0] == '-' || s[0] == '+') i = 1;
  if (i == s.size()) return false;
  for (size_t k = i; k < s.size(); ++k) {
    if (!std::isdigit(static_cast<unsigned char>(s[k]))) return false;
  }
  try {
    out = std::stoll(s);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

double parse_duration(const std::string& text) {
  const std::string bad = "bad duration '" + text + "' (expected e.g. 90s, 10m, 8h, 1h30m)";
  if (text.empty()) throw std::invalid_argument(bad);
  double total = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) {
      ++j;
    }
    if (j == i) throw std::invalid_argument(bad);
    double v;
    try {
      size_t used = 0;
      v = std::stod(text.substr(i, j - i), &used);
      if (used != j - i) throw std::invalid_argument(bad);
    } catch (const std::exception&) {
      throw std::invalid_argument(bad);
    }
    double unit = 1;
    if (j < text.size()) {
      switch (text[j]) {
        case 's':
          unit = 1;
          break;
        case 'm':
          unit = 60;
          break;
        case 'h':
          unit = 3600;
          break;
        case 'd':
          unit = 86400;
          break;
        default:
          throw std::invalid_argument(bad);
      }
      ++j;
    } else if (i != 0) {
      throw std::invalid_argument(bad);  // "1h30" is ambiguous
    }
    total += v * unit;
    i = j;
  }
  if (!(total > 0)) throw std::invalid_argument("duration '" + text + "' must be positive");
  return total;
}

ShardSpec parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  long long i = 0, n = 0;
  if (slash == std::string::npos || !parse_int(text.substr(0, slash), i) ||
      !parse_int(text.substr(slash + 1), n)) {
    throw std::invalid_argument("bad shard '" + text + "' (expected I/N, e.g. 0/4)");
  }
  if (n < 1 || n > (1 << 30) || i < 0 || i >= n) {
    throw std::invalid_argument("bad shard '" + text + "': need 0 <= I < N");
  }
  ShardSpec s;
  s.index = static_cast<int32_t>(i);
  s.count = static_cast<int32_t>(n);
  s.source = "--shard";
  return s;
}

ShardSpec resolve_shard(const std::optional<std::string>& flag,
                        const std::function<const char*(const char*)>& getenv_fn) {
  if (flag) return parse_shard(*flag);
  auto env_pair = [&](const char* idx_name, const char* cnt_name, const char* min_name,
                      const char* source) -> std::optional<ShardSpec> {
    const char* idx = getenv_fn(idx_name);
    const char* cnt = getenv_fn(cnt_name);
    if (!idx || !cnt || !*idx || !*cnt) return std::nullopt;
    long long i = 0, n = 0, lo = 0;
    if (!parse_int(idx, i) || !parse_int(cnt, n)) {
      throw std::invalid_argument(std::string("bad ") + idx_name + "='" + idx + "' or " + cnt_name +
                                  "='" + cnt + "'");
    }
    if (min_name) {
      const char* m = getenv_fn(min_name);
      if (m && *m) {
        if (!parse_int(m, lo)) {
          throw std::invalid_argument(std::string("bad ") + min_name + "='" + m + "'");
        }
        i -= lo;
      }
    }
    if (n < 1 || i < 0 || i >= n) {
      throw std::invalid_argument(std::string(idx_name) + "=" + idx + " is outside " + cnt_name +
                                  "=" + cnt);
    }
    ShardSpec s;
    s.index = static_cast<int32_t>(i);
    s.count = static_cast<int32_t>(n);
    s.source = source;
    return s;
  };
  if (auto s = env_pair("GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS", nullptr, "GTEST_*")) return *s;
  if (auto s = env_pair("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
                        "SLURM_ARRAY_*")) {
    return *s;
  }
  // A Kubernetes Indexed Job gives each pod its index; the count is the Job's completions, which
  // the manifest passes on.
  const char* k8s = getenv_fn("JOB_COMPLETION_INDEX");
  if (k8s && *k8s) {
    const char* n = getenv_fn("MLAFUZZ_SHARD_COUNT");
    if (!n || !*n) {
      throw std::invalid_argument(std::string("JOB_COMPLETION_INDEX=") + k8s +
                                  " needs MLAFUZZ_SHARD_COUNT (the Job's completions) in the "
                                  "environment, or --shard I/N");
    }
    if (auto s = env_pair("JOB_COMPLETION_INDEX", "MLAFUZZ_SHARD_COUNT", nullptr,
                          "JOB_COMPLETION_INDEX")) {
      return *s;
    }
  }
  return ShardSpec{};
}

std::vector<int> parse_devices(const std::string& text, int available) {
  std::vector<int> out;
  if (text == "none") return out;
  if (text == "all") {
    for (int i = 0; i < available; ++i) out.push_back(i);
    return out;
  }
  long long n = 0;
  if (text.find(',') == std::string::npos && parse_int(text, n)) {
    if (n < 0 || n > available) {
      throw std::invalid_argument("--devices " + text + ": this machine has " +
                                  std::to_string(available) + " device(s)");
    }
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? comma : comma - pos);
    long long d = 0;
    if (!parse_int(item, d) || d < 0) {
      throw std::invalid_argument("bad --devices '" + text +
                                  "' (expected all, none, a count, or a list like 0,2)");
    }
    if (d >= available) {
      throw std::invalid_argument("--devices " + text + ": device " + item +
                                  " does not exist (this machine has " + std::to_string(available) +
                                  ")");
    }
    for (int e : out) {
      if (e == d) throw std::invalid_argument("--devices " + text + ": device " + item + " twice");
    }
    out.push_back(static_cast<int>(d));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace mlafuzz::campaign
