// `mlafuzz fuzz`: time- or case-budgeted campaigns (harness/campaign/campaign.h).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "harness/backends/registry.h"
#include "harness/campaign/campaign.h"
#include "harness/campaign/options.h"
#include "harness/cli/commands.h"

namespace mlafuzz::cli {
namespace {

std::atomic<int> g_signals{0};

extern "C" void on_stop_signal(int) { g_signals.fetch_add(1); }

struct FuzzOptions {
  std::string backends = "available";
  std::string time;
  std::optional<uint64_t> cases;
  uint64_t seed = 1;
  std::string shard;
  std::string devices = "all";
  int jobs = 0;
  int workers_per_gpu = 0;
  std::string corpus = "corpus/findings";
  std::string report;
  std::string known;
  bool strict_known = false;
  std::string properties;
  std::string shrink_time = "30s";
  int shrink_evals = campaign::CampaignOptions{}.shrink_evals;
  std::string case_timeout = "60s";
  std::string profile = "default";
  std::string envelope;  // --envelope FILE.json
  std::string isolate = "device";
  std::string report_interval = "30s";
  std::string progress = "auto";
  std::optional<uint64_t> replay_index;
  std::string save_case;
  bool resume = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t c = s.find(',', pos);
    std::string item = s.substr(pos, c == std::string::npos ? c : c - pos);
    if (!item.empty()) out.push_back(item);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

std::string default_report_dir(const campaign::ShardSpec& shard) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  std::string dir = std::string("reports/") + buf;
  if (shard.count > 1) {
    dir += "-shard" + std::to_string(shard.index) + "of" + std::to_string(shard.count);
  }
  return dir;
}

int fuzz_command(const FuzzOptions& f) {
  campaign::CampaignOptions o;
  try {
    o.backends = parse_backend_list(f.backends);
    o.properties = split(f.properties);
    o.seed = f.seed;
    o.max_cases = f.cases;
    if (f.cases && *f.cases == 0) throw std::invalid_argument("--cases must be at least 1");
    if (!f.time.empty()) o.time_s = campaign::parse_duration(f.time);
    o.overrun_grace_s = std::max(10.0, 0.05 * o.time_s.value_or(60));
    o.shard = campaign::resolve_shard(
        f.shard.empty() ? std::nullopt : std::optional<std::string>(f.shard),
        [](const char* n) { return std::getenv(n); });
    o.devices = f.devices;
    if (f.jobs < 0) throw std::invalid_argument("--jobs must be >= 0");
    o.jobs = f.jobs;
    if (f.workers_per_gpu < 0) throw std::invalid_argument("--workers-per-gpu must be >= 0");
    o.workers_per_device = f.workers_per_gpu;
    o.corpus_dir = f.corpus;
    o.shrink_time_s = f.shrink_time.find_first_not_of("0smhd.") == std::string::npos &&
                              f.shrink_time.find_first_of("123456789") == std::string::npos
                          ? 0  // "0", "0s": no shrinking
                          : campaign::parse_duration(f.shrink_time);
    if (f.shrink_evals < 0) throw std::invalid_argument("--shrink-evals must be >= 0");
    o.shrink_evals = f.shrink_evals;
    o.case_timeout_s = campaign::parse_duration(f.case_timeout);
    // The campaign talks to python: workers directly: their call timeout is the case timeout.
    ::setenv("MLAFUZZ_PYTHON_TIMEOUT", std::to_string(o.case_timeout_s).c_str(), 1);
    o.report_interval_s = campaign::parse_duration(f.report_interval);
    o.profile = f.profile;
    (void)campaign::gen_config_for_profile(f.profile);
    if (!f.envelope.empty()) {
      o.envelope = load_envelope(f.envelope);  // std::invalid_argument naming the field
      o.envelope_path = f.envelope;
    }
    o.isolate = f.isolate;
    if (!f.known.empty()) {
      o.known = std::make_shared<const campaign::Ledger>(campaign::load_ledger(f.known));
    }
    o.strict_known = f.strict_known;
    if (f.progress == "live") {
      o.live_progress = 1;
    } else if (f.progress == "plain") {
      o.live_progress = 0;
    } else if (f.progress != "auto") {
      throw std::invalid_argument("bad --progress '" + f.progress + "' (auto, live or plain)");
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "mlafuzz fuzz: " << e.what() << '\n';
    return kExitBadInput;
  } catch (const campaign::LedgerError& e) {
    std::cerr << "mlafuzz fuzz: " << e.what() << '\n';
    return kExitBadInput;
  }
  if (f.replay_index) return campaign::replay_case(o, *f.replay_index, f.save_case);
  o.report_dir = f.report.empty() ? default_report_dir(o.shard) : f.report;
  if (f.resume && f.report.empty()) {
    std::cerr << "mlafuzz fuzz: --resume needs --report (the folder of the run to continue)\n";
    return kExitBadInput;
  }
  o.resume = f.resume;

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  o.signals = &g_signals;
  return campaign::run_campaign(o);
}

}  // namespace

void register_fuzz(CLI::App& app, CommandTable& table) {
  auto f = std::make_shared<FuzzOptions>();
  CLI::App* sub = app.add_subcommand(
      "fuzz",
      "Fuzzing campaign: generated cases on every backend and property until the time or case "
      "budget is spent; failures shrunk, deduplicated and saved to the corpus; report.json, "
      "junit.xml and report.html written (and rewritten every --report-interval). With no "
      "options: a one-minute campaign on every available backend. Exit 0 no finding, 1 "
      "findings, 2 bad usage.");
  sub->add_option("--backends", f->backends,
                  "comma-separated backends, 'available' (default) or 'all'; cpu-mma~<mutant> "
                  "selects a planted-bug host model")
      ->capture_default_str();
  sub->add_option("--time", f->time, "time budget: 90s, 10m, 8h (default 1m without --cases)");
  sub->add_option("--cases", f->cases, "case budget (stops at whichever budget ends first)");
  sub->add_option("--seed", f->seed, "campaign seed")->capture_default_str();
  sub->add_option("--shard", f->shard,
                  "I/N: this process runs case numbers n with global index n*N+I (default from "
                  "GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS or SLURM_ARRAY_TASK_ID/"
                  "SLURM_ARRAY_TASK_COUNT, else 0/1)");
  sub->add_option("--devices", f->devices,
                  "GPUs for device backends, one worker per GPU: all, a count, or a list 0,2")
      ->capture_default_str();
  sub->add_option("--jobs", f->jobs, "evaluation threads (default: every core)");
  sub->add_option("--workers-per-gpu", f->workers_per_gpu,
                  "worker processes per GPU backend and GPU, shared by the threads (default 2, "
                  "at most the threads per GPU)");
  sub->add_option("--corpus", f->corpus, "folder for findings")->capture_default_str();
  sub->add_option("--report", f->report, "report folder (default reports/<UTC time>)");
  sub->add_option("--properties", f->properties, "comma-separated properties (default all)");
  sub->add_option("--shrink-evals", f->shrink_evals,
                  "evaluations of shrinking per new finding: where a shrink stops, the same on "
                  "any machine (0: no shrinking)")
      ->capture_default_str();
  sub->add_option("--shrink-time", f->shrink_time,
                  "wall-clock cap on shrinking per new finding, a safety net (0: no shrinking)")
      ->capture_default_str();
  sub->add_option("--case-timeout", f->case_timeout,
                  "a worker call longer than this is a hang (a fault finding)")
      ->capture_default_str();
  sub->add_option("--profile", f->profile,
                  "case generator: default (every family) or one family, e.g. production")
      ->capture_default_str();
  sub->add_option("--envelope", f->envelope,
                  "generate only cases inside this envelope (JSON, docs/plugins.md \"Envelopes\"), "
                  "intersected with what the backends declare");
  sub->add_option("--isolate", f->isolate,
                  "which backends run in worker processes: device (GPU backends and plugins), "
                  "all, none")
      ->capture_default_str();
  sub->add_option("--known", f->known,
                  "known-failure ledger (JSON, docs/nightly.md): findings an entry matches are "
                  "reported as known and do not fail the run; an expired entry fails it; an "
                  "entry no finding matched has its case replayed (fixed? remove the entry)");
  sub->add_flag("--strict-known", f->strict_known,
                "with --known: also fail when an entry's recorded case now passes");
  sub->add_option("--report-interval", f->report_interval, "rewrite the report this often")
      ->capture_default_str();
  sub->add_option("--progress", f->progress, "auto, live (one updated line) or plain")
      ->capture_default_str();
  sub->add_option("--replay-index", f->replay_index,
                  "regenerate global case K of --seed/--profile, evaluate it and print every "
                  "outcome (exit 1 if a property fails)");
  sub->add_option("--save-case", f->save_case, "with --replay-index: save the recipe here");
  sub->add_flag("--resume", f->resume,
                "continue the campaign whose report is in --report (stopped, killed or requeued; "
                "same seed, shard, profile, backends and properties): its cases are not run "
                "again, its statistics and findings carry on, its time counts against --time and "
                "its cases against --cases; without a report there, start at case 0");
  table.push_back({sub, [f] { return fuzz_command(*f); }});
}

}  // namespace mlafuzz::cli
