// `mlafuzz report`: summary, merge of shard reports, comparison of two nights, re-rendering.
#include "harness/campaign/report.h"

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/fileio.h"
#include "harness/campaign/ledger.h"
#include "harness/cli/commands.h"

namespace mlafuzz::cli {
namespace {

namespace cp = mlafuzz::campaign;

struct ReportOptions {
  std::string input;
  std::vector<std::string> compare;
  std::string known;
  double factor = 2.0;
  double min_tightness = 0.1;
  std::vector<std::string> merge_inputs;
  std::string merge_out, merge_corpus, merge_html, merge_junit;
  std::string render_in, render_out;
};

// Marks the report's findings that the ledger at `path` knows ("" : none) and prints what the
// ledger did (its entries' cases are not replayed here: `fuzz --known` does that). True when the
// ledger fails the report: a finding no entry knows, or an expired entry.
bool apply_known(const std::string& path, cp::Report& r) {
  if (path.empty()) return !r.findings.empty();
  const cp::Ledger l = cp::load_ledger(path);
  const cp::LedgerResult res = cp::apply_ledger(l, r.findings, cp::utc_today());
  std::cout << cp::render_ledger(l, res, {});
  return res.unknown > 0 || !res.expired.empty();
}

// Copies each finding's representative corpus entry (one per group) into `dir` and points the
// report at it.
void gather_corpus(cp::Report& r, const std::string& dir) {
  namespace fs = std::filesystem;
  make_dirs(dir);
  for (auto& f : r.findings) {
    if (f.corpus_path.empty()) continue;
    std::string bytes;
    try {
      bytes = read_file(f.corpus_path);
    } catch (const std::exception& e) {
      std::cerr << "mlafuzz report merge: finding " << f.signature << ": " << e.what() << '\n';
      continue;
    }
    const std::string target = (fs::path(dir) / fs::path(f.corpus_path).filename()).string();
    write_file_atomic(target, bytes);
    const auto pos = f.repro.find(f.corpus_path);
    if (pos != std::string::npos) f.repro.replace(pos, f.corpus_path.size(), target);
    f.corpus_path = target;
  }
}

int report_command(const ReportOptions& o, CLI::App* merge, CLI::App* html, CLI::App* junit) {
  try {
    if (merge->parsed()) {
      std::vector<cp::Report> in;
      for (const auto& p : o.merge_inputs) in.push_back(cp::load_report(p));
      cp::Report m = cp::merge_reports(in);
      if (!o.merge_corpus.empty()) gather_corpus(m, o.merge_corpus);
      cp::save_report(m, o.merge_out);
      if (!o.merge_html.empty()) write_file_atomic(o.merge_html, cp::render_html(m));
      if (!o.merge_junit.empty()) write_file_atomic(o.merge_junit, cp::render_junit(m));
      std::cout << "merged " << in.size() << " reports into " << o.merge_out << '\n'
                << cp::render_summary(m);
      return kExitOk;
    }
    if (html->parsed() || junit->parsed()) {
      const cp::Report r = cp::load_report(o.render_in);
      write_file_atomic(o.render_out, html->parsed() ? cp::render_html(r) : cp::render_junit(r));
      std::cout << "wrote " << o.render_out << '\n';
      return kExitOk;
    }
    if (!o.compare.empty()) {
      if (o.compare.size() != 2) {
        std::cerr << "mlafuzz report --compare: expected OLD.json NEW.json\n";
        return kExitBadInput;
      }
      if (!(o.factor >= 1)) {
        std::cerr << "mlafuzz report --compare: --factor must be >= 1\n";
        return kExitBadInput;
      }
      const cp::Report a = cp::load_report(o.compare[0]);
      cp::Report b = cp::load_report(o.compare[1]);
      apply_known(o.known, b);
      const cp::Comparison c = cp::compare_reports(a, b, {o.factor, o.min_tightness});
      std::cout << c.text;
      return c.regression ? kExitFailed : kExitOk;
    }
    if (o.input.empty()) {
      std::cerr << "mlafuzz report: give a report to summarize, --compare OLD NEW, or a "
                   "subcommand (merge, html, junit); see --help\n";
      return kExitBadInput;
    }
    cp::Report r = cp::load_report(o.input);
    if (o.known.empty()) {
      std::cout << cp::render_summary(r);
      return kExitOk;
    }
    const bool fails = apply_known(o.known, r);
    std::cout << cp::render_summary(r);
    return fails ? kExitFailed : kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "mlafuzz report: " << e.what() << '\n';
    return kExitBadInput;
  }
}

}  // namespace

void register_report(CLI::App& app, CommandTable& table) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* sub = app.add_subcommand(
      "report",
      "Campaign reports: `report IN.json` prints a summary; `report --compare OLD.json "
      "NEW.json` prints what changed and exits 1 on a regression (a new finding group: the same "
      "bug on another night's seed is still open, not new; or a worst tightness up by more than "
      "--factor); `report merge` combines shard reports (findings by group); "
      "`report html`/`report junit` re-render.");
  sub->add_option("input", o->input, "report.json to summarize");
  sub->add_option("--compare", o->compare, "OLD.json NEW.json")->expected(2);
  sub->add_option("--known", o->known,
                  "known-failure ledger (JSON): its findings are marked known; with a report, exit "
                  "1 when a finding is not known or an entry expired; with --compare, a new "
                  "finding the ledger knows is no regression");
  sub->add_option("--factor", o->factor, "tightness regression factor")->capture_default_str();
  sub->add_option("--min-tightness", o->min_tightness,
                  "ignore tightness changes while the new worst is below this")
      ->capture_default_str();
  CLI::App* merge = sub->add_subcommand(
      "merge",
      "Combine shard reports (sums, histograms, worst lists, findings by group, corpora).");
  merge->add_option("reports", o->merge_inputs, "report.json files")->required()->expected(-1);
  merge->add_option("-o,--output", o->merge_out, "merged report.json")->required();
  merge->add_option("--corpus", o->merge_corpus,
                    "copy each finding's corpus entry into this folder");
  merge->add_option("--html", o->merge_html, "also write the HTML report here");
  merge->add_option("--junit", o->merge_junit, "also write JUnit XML here");
  CLI::App* html = sub->add_subcommand("html", "Render a report.json as self-contained HTML.");
  html->add_option("report", o->render_in, "report.json")->required();
  html->add_option("-o,--output", o->render_out, "report.html")->required();
  CLI::App* junit = sub->add_subcommand("junit", "Render a report.json as JUnit XML.");
  junit->add_option("report", o->render_in, "report.json")->required();
  junit->add_option("-o,--output", o->render_out, "junit.xml")->required();
  sub->require_subcommand(0, 1);
  table.push_back(
      {sub, [o, merge, html, junit] { return report_command(*o, merge, html, junit); }});
}

}  // namespace mlafuzz::cli
