// `mlafuzz nights DIR`: the state of every finding group across nights (lifecycle.h).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/fileio.h"
#include "harness/campaign/ledger.h"
#include "harness/campaign/lifecycle.h"
#include "harness/campaign/report.h"
#include "harness/cli/commands.h"

namespace mlafuzz::cli {
namespace {

namespace cp = mlafuzz::campaign;
namespace fs = std::filesystem;

struct NightsOptions {
  std::string dir, night, known;
  int flaky_runs = 3;
};

int nights_command(const NightsOptions& o) {
  try {
    std::vector<std::string> nights;  // folders holding a report.json, in name order
    if (!fs::is_directory(o.dir)) throw std::runtime_error(o.dir + ": not a folder");
    for (const auto& d : fs::directory_iterator(o.dir)) {
      if (d.is_directory() && fs::exists(d.path() / "report.json")) {
        nights.push_back(d.path().filename().string());
      }
    }
    std::sort(nights.begin(), nights.end());
    if (nights.empty()) throw std::runtime_error(o.dir + ": no night folder with a report.json");
    const std::string night = o.night.empty() ? nights.back() : o.night;
    const auto at = std::find(nights.begin(), nights.end(), night);
    if (at == nights.end()) {
      throw std::runtime_error(o.dir + "/" + night + ": no such night (or no report.json there)");
    }
    cp::Lifecycle prev;  // the closest earlier night with a lifecycle
    for (auto it = at; it != nights.begin();) {
      --it;
      const fs::path p = fs::path(o.dir) / *it / "lifecycle.json";
      if (fs::exists(p)) {
        prev = cp::load_lifecycle(p.string());
        break;
      }
    }
    if (o.flaky_runs < 0) throw std::runtime_error("--flaky-runs must be >= 0");
    const fs::path here = fs::path(o.dir) / night;
    cp::Report r = cp::load_report((here / "report.json").string());
    cp::Ledger ledger;
    if (!o.known.empty()) ledger = cp::load_ledger(o.known);
    cp::NightOptions no;
    no.flaky_runs = o.flaky_runs;
    no.known = o.known.empty() ? nullptr : &ledger;
    const cp::Lifecycle l = cp::advance_night(night, prev, r, no);
    cp::save_lifecycle(l, (here / "lifecycle.json").string());
    cp::save_report(r, (here / "report.json").string());
    write_file_atomic((here / "report.html").string(), cp::render_html(r));
    write_file_atomic((here / "junit.xml").string(), cp::render_junit(r));
    std::cout << cp::render_lifecycle(l) << "states: " << (here / "lifecycle.json").string()
              << "; report.json, report.html and junit.xml there show them\n";
    bool open = false;
    for (const auto& g : l.groups) open = open || (cp::is_open(g.state) && g.known.empty());
    return open ? kExitFailed : kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "mlafuzz nights: " << e.what() << '\n';
    return kExitBadInput;
  }
}

}  // namespace

void register_nights(CLI::App& app, CommandTable& table) {
  auto o = std::make_shared<NightsOptions>();
  CLI::App* sub = app.add_subcommand(
      "nights",
      "Findings across nights: DIR holds one folder per night (names in time order) with its "
      "report.json; the last night (or --night) gets, for every group, new / open / fixed / "
      "verified / regressed and the night it changed, replaying the minimal case of each group "
      "tonight's campaign did not meet and each new group --flaky-runs times; writes "
      "lifecycle.json and rewrites the night's report.json, report.html and junit.xml; exit 1 "
      "while a group no ledger entry knows is open");
  sub->add_option("dir", o->dir, "the nights folder")->required();
  sub->add_option("--night", o->night, "the night's folder name (default: the last)");
  sub->add_option("--known", o->known, "known-failure ledger (JSON, see fuzz --known)");
  sub->add_option("--flaky-runs", o->flaky_runs,
                  "replays of each new group's minimal case; flaky when not all fail")
      ->capture_default_str();
  table.push_back({sub, [o] { return nights_command(*o); }});
}

}  // namespace mlafuzz::cli
