// `mlafuzz run` and `mlafuzz list-backends`.
//
// run: case file -> materialize -> every requested backend -> comparison against the float64
// oracle (the reference, run even when not listed) -> optional .npy dump for independent checks.
// The verdict of each backend is the `tolerance` property's outcome, computed by the same code as
// in a campaign (judge_runs, properties/evaluate.h); FlashMLA's and the original test's metrics
// are printed beside it for information.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/case.h"
#include "core/command.h"
#include "core/compare.h"
#include "core/fileio.h"
#include "core/materialize.h"
#include "core/npy.h"
#include "harness/backends/python_backend.h"
#include "harness/backends/registry.h"
#include "harness/cli/commands.h"
#include "oracle/oracle.h"
#include "properties/evaluate.h"

namespace mlafuzz::cli {
namespace {

constexpr const char* kReference = "oracle";

struct RunOptions {
  std::string case_path;
  std::string backends = kReference;
  std::string dump_dir;
  IsolationFlags isolation;
};

struct Ran {
  std::string name;
  std::unique_ptr<Backend> backend;
  RunResult result;
  bool listed = true;  // false for the oracle when it only runs as the reference
  bool skipped = false;
};

std::string shape(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (int64_t d : dims) {
    if (s.size() > 1) s += ',';
    s += std::to_string(d);
  }
  return s + "]";
}

// The leading dims of a [B, s_q, ...] array: [B, ...] when s_q = 1 (the shapes of version 1).
std::vector<int64_t> with_tokens(const MaterializedCase& m, std::vector<int64_t> rest) {
  std::vector<int64_t> s{m.batch};
  if (m.s_q > 1) s.push_back(m.s_q);
  s.insert(s.end(), rest.begin(), rest.end());
  return s;
}

// " s_q=3 extra: topk=512 P=64 S0=37376 pages=9" for the production decode, "" otherwise.
std::string production_summary(const MaterializedCase& m) {
  std::string s = m.s_q > 1 ? fmt::format(" s_q={}", m.s_q) : "";
  if (m.has_extra) {
    s += fmt::format(" extra: topk={} P={} S0={} pages={}", m.extra_topk, m.extra_geom.page_size,
                     m.extra_geom.page_stride, m.extra_geom.num_pages);
  }
  return s;
}

std::string output_summary(const MaterializedCase& m, const RunResult& r) {
  double max_abs = 0, sum_abs = 0;
  int64_t finite = 0, out_nonfinite = 0;
  for (double v : r.out) {
    if (!std::isfinite(v)) {
      ++out_nonfinite;
      continue;
    }
    max_abs = std::max(max_abs, std::fabs(v));
    sum_abs += std::fabs(v);
    ++finite;
  }
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  int64_t pos_inf = 0, neg_inf = 0, nan = 0;
  for (double v : r.lse) {
    if (std::isnan(v)) {
      ++nan;
    } else if (std::isinf(v)) {
      (v > 0 ? pos_inf : neg_inf)++;
    } else {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  const std::string lse_range =
      lo <= hi ? fmt::format("[{:.6g}, {:.6g}]", lo, hi) : std::string("[no finite value]");
  return fmt::format(
      "out {} max|out|={:.4e} mean|out|={:.4e} non-finite={} | lse {} range {} +inf={} -inf={} "
      "nan={} | {:.3f} ms",
      shape(with_tokens(m, {m.heads, m.d_v()})), max_abs,
      finite ? sum_abs / static_cast<double>(finite) : 0.0, out_nonfinite,
      shape(with_tokens(m, {m.heads})), lse_range, pos_inf, neg_inf, nan, r.seconds * 1e3);
}

// Runs one backend; a backend never aborts the command: errors become results.
void run_backend(const MaterializedCase& m, Ran& ran) {
  const Availability av = ran.backend->traits().availability;
  if (!av.available) {
    ran.result.status = RunStatus::kError;
    ran.result.message = "not available here: " + av.reason;
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    std::vector<CheckedRun> one = ran.backend->run_batch({&m});
    if (one.size() != 1) throw std::logic_error("the backend lost the case");
    if (one[0].unsupported) {
      ran.result.status = RunStatus::kUnsupported;
      ran.result.message = *one[0].unsupported;
      ran.skipped = true;
      return;
    }
    ran.result = std::move(one[0].result);
  } catch (const std::exception& e) {
    ran.result = RunResult{};
    ran.result.status = RunStatus::kError;
    ran.result.message = std::string("threw: ") + e.what();
  }
  if (ran.result.seconds == 0) {
    ran.result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

const char* status_name(RunStatus s) {
  switch (s) {
    case RunStatus::kOk:
      return "ok";
    case RunStatus::kUnsupported:
      return "unsupported";
    case RunStatus::kError:
      return "ERROR";
    case RunStatus::kFault:
      return "FAULT";
  }
  return "?";
}

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// The file-name suffix of a backend's outputs: "_<name>", '/' written '_'
// (python:dir/file.py:func).
std::string file_suffix(const std::string& name) {
  std::string suffix = "_" + name;
  std::replace(suffix.begin(), suffix.end(), '/', '_');
  return suffix;
}

// The rows of q (with its head padding) and of the index lists as [B, (s_q,) topk]: the
// batch-row gaps (q_batch_pad, indices_row_pad) left out, their strides recorded in params.json.
struct PackedRows {
  std::vector<uint16_t> q;
  std::vector<int32_t> indices, extra_indices;
};

PackedRows packed_rows(const MaterializedCase& m) {
  PackedRows p;
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int32_t s = 0; s < m.s_q; ++s) {
      const auto row = m.q.begin() + b * m.q_batch_stride + s * m.q_token_stride;
      p.q.insert(p.q.end(), row, row + m.heads * m.q_head_stride);
      const auto irow = m.indices.begin() + b * m.indices_batch_stride + s * m.indices_token_stride;
      p.indices.insert(p.indices.end(), irow, irow + m.topk);
      if (m.has_extra) {
        const auto xrow = m.extra_indices.begin() + b * m.extra_indices_batch_stride +
                          s * m.extra_indices_token_stride;
        p.extra_indices.insert(p.extra_indices.end(), xrow, xrow + m.extra_topk);
      }
    }
  }
  return p;
}

// The inputs as the kernels see them: packed rows, and the whole buffers with their row gaps.
void write_dump_inputs(const std::function<std::string(const std::string&)>& path,
                       const MaterializedCase& m) {
  const PackedRows rows = packed_rows(m);
  write_npy(path("q.npy"), rows.q, with_tokens(m, {m.heads, m.q_head_stride}));
  // The whole buffers as the kernels get them, row gaps included (params.json's "call" gives
  // their strides): mlafuzz.replay builds its call from these.
  write_npy(path("q_raw.npy"), m.q, {static_cast<int64_t>(m.q.size())});
  write_npy(path("indices_raw.npy"), m.indices, {static_cast<int64_t>(m.indices.size())});
  write_npy(path("kv_cache.npy"), m.cache.vec(), {m.geom.num_pages, m.geom.page_stride});
  write_npy(path("indices.npy"), rows.indices, with_tokens(m, {m.topk}));
  if (!m.topk_length.empty()) write_npy(path("topk_length.npy"), m.topk_length, {m.batch});
  if (!m.sink.empty()) write_npy(path("sink.npy"), m.sink, {m.heads});
  if (m.has_extra) {
    write_npy(path("extra_kv_cache.npy"), m.extra_cache.vec(),
              {m.extra_geom.num_pages, m.extra_geom.page_stride});
    write_npy(path("extra_indices.npy"), rows.extra_indices, with_tokens(m, {m.extra_topk}));
    write_npy(path("extra_indices_raw.npy"), m.extra_indices,
              {static_cast<int64_t>(m.extra_indices.size())});
    if (!m.extra_topk_length.empty()) {
      write_npy(path("extra_topk_length.npy"), m.extra_topk_length, {m.batch});
    }
  }
}

// The outputs of every backend that ran (the reference's also in float64).
void write_dump_outputs(const std::function<std::string(const std::string&)>& path,
                        const MaterializedCase& m, const std::vector<Ran>& runs) {
  const std::vector<int64_t> out_shape = with_tokens(m, {m.heads, m.d_v()}),
                             lse_shape = with_tokens(m, {m.heads});
  for (const Ran& r : runs) {
    if (!r.result.ok()) continue;
    const std::string suffix = r.name == kReference ? "" : file_suffix(r.name);
    write_npy(path("out" + suffix + ".npy"), to_float(r.result.out), out_shape);
    write_npy(path("lse" + suffix + ".npy"), to_float(r.result.lse), lse_shape);
    if (r.name == kReference) {
      write_npy(path("out64.npy"), r.result.out, out_shape);
      write_npy(path("lse64.npy"), r.result.lse, lse_shape);
    }
  }
}

// Every listed backend's tolerance bound (whether its run succeeded or not: the bound depends
// on the case and the backend's declarations only), as the tolerance property applies it.
void write_dump_bounds(const std::function<std::string(const std::string&)>& path,
                       const MaterializedCase& m, const std::vector<Ran>& runs) {
  const Ran& ref = runs.front();
  if (!ref.result.ok()) return;
  const OracleResult oracle{ref.result.out, ref.result.lse};
  for (const Ran& r : runs) {
    if (r.name == kReference) continue;
    const ElementBounds b = tolerance_bounds(m, oracle, *r.backend);
    const std::string suffix = file_suffix(r.name);
    write_npy(path("bound_out" + suffix + ".npy"), b.out, with_tokens(m, {m.heads, m.d_v()}));
    write_npy(path("bound_lse" + suffix + ".npy"), b.lse, with_tokens(m, {m.heads}));
  }
}

// params.json: the resolved scalars and strides scripts/check_dump.py needs to recompute the
// oracle from the raw bytes.
nlohmann::ordered_json dump_params(const Case& c, const MaterializedCase& m) {
  nlohmann::ordered_json p;
  p["geometry"] = geometry_to_json(m.geom);  // page_stride resolved
  p["batch"] = m.batch;
  p["s_q"] = m.s_q;
  p["heads"] = m.heads;
  p["topk"] = m.topk;
  if (m.has_extra) {
    p["extra_geometry"] = geometry_to_json(m.extra_geom);
    p["extra_topk"] = m.extra_topk;
  }
  p["d_qk"] = m.d_qk();
  p["d_v"] = m.d_v();
  p["q_head_stride"] = m.q_head_stride;
  // The call's batch strides (the .npy inputs above are without the row gaps).
  p["q_batch_stride"] = m.q_batch_stride;
  p["indices_batch_stride"] = m.indices_batch_stride;
  p["out_head_stride"] = m.out_head_stride;
  p["out_batch_stride"] = m.out_batch_stride;
  p["lse_batch_stride"] = m.lse_batch_stride;
  // The token strides (s_q query tokens per batch row).
  p["q_token_stride"] = m.q_token_stride;
  p["indices_token_stride"] = m.indices_token_stride;
  p["out_token_stride"] = m.out_token_stride;
  p["lse_token_stride"] = m.lse_token_stride;
  if (m.has_extra) {
    p["extra_indices_token_stride"] = m.extra_indices_token_stride;
    p["extra_indices_batch_stride"] = m.extra_indices_batch_stride;
  }
  p["sm_scale"] = m.sm_scale64;  // the fp32 value the kernels get, exactly
  p["conventions"] = case_to_json_value(c)["conventions"];
  // The scalar fields of the call a python: kernel gets (docs/WORKER_PROTOCOL.md).
  p["call"] = nlohmann::ordered_json::parse(python_call_fields(m));
  p["content_hash"] = fmt::format("{:016x}", content_hash(m));
  return p;
}

// Inputs as the kernels see them, outputs of every backend, the recipe, and the resolved
// scalars scripts/check_dump.py needs to recompute the oracle from the raw bytes.
void write_dump(const std::string& dir, const Case& c, const MaterializedCase& m,
                const std::vector<Ran>& runs) {
  make_dirs(dir);
  const auto path = [&](const std::string& f) { return dir + "/" + f; };
  write_dump_inputs(path, m);
  write_dump_outputs(path, m, runs);
  write_dump_bounds(path, m, runs);
  write_file_atomic(path("case.json"), to_json(c));
  write_file_atomic(path("params.json"), json_to_text(dump_params(c, m)));
}

// The backends to run, as named (plugins in a worker process: a crash or exit() in one is a
// FAULT line, exit 1), the reference first: added when not listed.
std::vector<Ran> backends_to_run(const std::string& list, const campaign::IsolationOptions& iso) {
  std::vector<Ran> runs;
  bool have_reference = false;
  for (const std::string& name : parse_backend_list(list)) {
    have_reference = have_reference || name == kReference;
    // Named as the backend names itself, as `fuzz` does: a plugin given by its path prints as
    // plugin:<declared name> (and its .npy files are named so).
    std::unique_ptr<Backend> be = campaign::make_isolated_backend(name, iso);
    const std::string own = be->traits().name;
    runs.push_back(Ran{own, std::move(be), {}, true, false});
  }
  if (!have_reference) {
    runs.insert(runs.begin(), Ran{kReference, make_backend(kReference), {}, false, false});
  }
  return runs;
}

void print_case_line(const Case& c, const MaterializedCase& m, const std::string& case_path) {
  std::cout << fmt::format(
      "case {}: {} B={} H={} topk={} P={} S0={} pages={} d_qk={} d_v={} sm_scale={:.9g}{} "
      "hash={:016x}\n",
      c.name.empty() ? case_path : c.name, layout_name(m.geom.layout), m.batch, m.heads, m.topk,
      m.geom.page_size, m.geom.page_stride, m.geom.num_pages, m.d_qk(), m.d_v(), m.sm_scale,
      production_summary(m), content_hash(m));
}

// Runs every backend and prints its line. Returns whether one failed (an error, a fault or a
// guard write; an unsupported case is no failure).
bool run_and_print(const MaterializedCase& m, std::vector<Ran>& runs) {
  bool failed = false;
  for (Ran& r : runs) {
    run_backend(m, r);
    const std::string label = r.listed ? r.name : r.name + " (reference)";
    if (r.result.ok()) {
      std::cout << fmt::format("{:<22} {}\n", label, output_summary(m, r.result));
    } else {
      std::cout << fmt::format("{:<22} {}: {}\n", label, status_name(r.result.status),
                               r.result.message);
      if (!r.skipped) failed = true;
    }
    if (r.result.guard_violations != 0) failed = true;
  }
  return failed;
}

// One comparison's lines: FlashMLA's and the original test's metrics.
void print_comparison(const MaterializedCase& m, const Comparison& cmp, const char* note) {
  const std::string prefix =
      fmt::format("B={} H={} topk={} len={}", m.batch, m.heads, m.topk, m.s_q);  // len: s_q
  std::cout << fmt::format("{} vs {}{}: {}: {}\n", cmp.backend, cmp.reference, note, prefix,
                           cmp.original_line());
  std::string lines = "  " + cmp.metrics_lines();
  for (size_t i = 0; (i = lines.find('\n', i)) != std::string::npos; i += 3) {
    lines.insert(i + 1, "  ");
  }
  std::cout << lines << "\n";
}

// Each backend that ran against the reference: its metrics, then the verdict, the `tolerance`
// property as a campaign computes it. Returns whether a verdict failed.
bool print_verdicts(const MaterializedCase& m, const std::vector<Ran>& runs) {
  const Ran& ref = runs.front();  // the reference is always first
  if (!ref.result.ok()) {
    std::cout << "no comparison: the reference oracle did not run\n";
    return false;
  }
  std::vector<std::pair<Backend*, const RunResult*>> judged;
  for (const Ran& r : runs) {
    if (r.name == kReference || !r.result.ok()) continue;
    judged.emplace_back(r.backend.get(), &r.result);
  }
  const std::vector<PropertyOutcome> outcomes =
      judged.empty() ? std::vector<PropertyOutcome>{} : judge_runs(m, judged);
  auto tolerance_of = [&](const std::string& name) -> const PropertyOutcome* {
    for (const auto& o : outcomes) {
      if (o.property == "tolerance" && o.backend == name) return &o;
    }
    return nullptr;
  };
  bool failed = false;
  for (const Ran& r : runs) {
    if (r.name == kReference || !r.result.ok()) continue;
    const Comparison cmp =
        compare_results(r.result, ref.result, m.query_rows(), m.heads, m.d_v(), r.name, kReference);
    print_comparison(m, cmp, "");
    // Outcomes carry Backend::name(), which may differ from the name given (plugin:PATH).
    const PropertyOutcome* tol = tolerance_of(r.backend->traits().name);
    if (tol == nullptr || !tol->applicable) {
      std::cout << "  verdict n/a: tolerance property not applicable"
                << (tol ? " (" + tol->detail + ")" : std::string()) << "\n";
      failed = failed || cmp.guard_violations != 0;
      continue;
    }
    const bool pass = tol->passed && cmp.guard_violations == 0;
    std::cout << fmt::format(
        "  verdict {}: tolerance property, error/bound tightness={:.3g}{} (as in a campaign; "
        "FlashMLA's fixed tolerances above are informational){}\n",
        pass ? "PASS" : "FAIL", tol->tightness,
        tol->nonfinite_mismatch ? ", non-finite mismatch" : "",
        tol->passed ? "" : "\n  worst: " + tol->detail);
    failed = failed || !pass;
  }
  return failed;
}

// The original test's view: the new MMA kernel against the old SIMT one. Informational: the
// pass/fail contract is against the oracle.
void print_mma_vs_simt(const MaterializedCase& m, const std::vector<Ran>& runs) {
  for (const Ran& a : runs) {
    const std::string partner = a.backend->traits().simt_partner;
    if (partner.empty() || !a.result.ok()) continue;
    for (const Ran& b : runs) {
      if (b.name != partner || !b.result.ok()) continue;
      print_comparison(
          m, compare_results(a.result, b.result, m.query_rows(), m.heads, m.d_v(), a.name, b.name),
          " (informational)");
    }
  }
}

// The command that runs the case again on the same backends, as pasted from anywhere.
std::string run_again_command(const RunOptions& o) {
  std::error_code ec;
  const std::filesystem::path case_path = std::filesystem::absolute(o.case_path, ec);
  std::string backends;
  for (const std::string& name : parse_backend_list(o.backends)) {
    backends += (backends.empty() ? "" : ",") + absolute_backend_name(name);
  }
  return command_to_run_again() + " run --case " +
         shell_word(ec ? o.case_path : case_path.string()) + " --backends " + shell_word(backends);
}

int run_command(const RunOptions& o) {
  // Everything that can be bad input is checked before anything runs or is written.
  const Case c = load_case(o.case_path);
  std::vector<Ran> runs = backends_to_run(o.backends, isolation_options(o.isolation));
  const MaterializedCase m = materialize(c);
  print_case_line(c, m, o.case_path);
  bool failed = run_and_print(m, runs);
  failed = print_verdicts(m, runs) || failed;
  print_mma_vs_simt(m, runs);
  if (!o.dump_dir.empty()) {
    write_dump(o.dump_dir, c, m, runs);
    std::cout << "dumped inputs and outputs to " << o.dump_dir
              << " (check: python3 scripts/check_dump.py " << o.dump_dir << ")\n";
  }
  if (failed) std::cout << "FAILED; reproduce with: " << run_again_command(o) << "\n";
  return failed ? kExitFailed : kExitOk;
}

// One row of list-backends; `width`: the name column's width (the longest name listed), so the
// columns line up whatever the names.
void print_backend_row(const std::string& name, size_t width, const std::string& summary,
                       const std::function<std::unique_ptr<Backend>()>& make) {
  std::string precision = "?", state;
  try {
    const BackendTraits t = make()->traits();
    precision = precision_name(t.precision);
    state = t.availability.available ? "available" : "unavailable: " + t.availability.reason;
  } catch (const std::exception& e) {
    state = std::string("unavailable: ") + e.what();
  }
  std::cout << fmt::format("{:<{}} {:<10} {:<11} {}\n", name, width, precision,
                           state.rfind("available", 0) == 0 ? "available" : "unavailable", summary);
  if (state.rfind("unavailable", 0) == 0) std::cout << fmt::format("{:<{}} {}\n", "", width, state);
}

// Every built-in backend, or the ones named (python: and plugin: backends are described by
// what they declare).
int list_backends_command(const std::string& names) {
  if (names.empty()) {
    size_t width = 0;
    for (const BackendSpec& info : builtin_backends()) width = std::max(width, info.name.size());
    for (const BackendSpec& info : builtin_backends()) {
      print_backend_row(info.name, width, info.summary, info.make);
    }
    return kExitOk;
  }
  const std::vector<std::string> listed = parse_backend_list(names);
  size_t width = 0;
  for (const std::string& name : listed) width = std::max(width, name.size());
  for (const std::string& name : listed) {
    std::string summary;
    if (name.rfind(kPythonPrefix, 0) == 0) {
      const PythonDescription d = describe_python_backend(name);  // throws: exit 2
      summary = "Python kernel '" + d.name + "' on " + d.device +
                (d.description.empty() ? "" : ": " + d.description);
    }
    print_backend_row(name, width, summary, [&name] { return make_backend(name); });
  }
  return kExitOk;
}

}  // namespace

void register_run(CLI::App& app, CommandTable& table) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand(
      "run",
      "Materialize a case, run backends on it and compare each with the float64 oracle. "
      "Exit 0 ok, 1 a comparison failed or a backend errored, 2 bad input.");
  sub->add_option("--case", opts->case_path,
                  "case file (JSON recipe, or a corpus entry that wraps one)")
      ->required();
  sub->add_option("--backends", opts->backends,
                  "comma-separated backend names (see list-backends), or 'all' / 'available'; "
                  "the oracle always runs as the reference")
      ->capture_default_str();
  sub->add_option("--dump", opts->dump_dir,
                  "write inputs (q, kv_cache, indices, topk_length, sink), outputs (out, lse; "
                  "float32 and float64), each backend's tolerance bound (bound_out_*, "
                  "bound_lse_*) as .npy, plus case.json and params.json, into DIR");
  add_isolation_flags(sub, opts->isolation);
  table.push_back({sub, [opts] { return run_command(*opts); }});
}

void register_list_backends(CLI::App& app, CommandTable& table) {
  CLI::App* sub =
      app.add_subcommand("list-backends",
                         "List every built-in backend, its precision pipeline, and whether it is "
                         "available in this build (and why not).");
  auto names = std::make_shared<std::string>();
  sub->add_option("--backends", *names,
                  "describe these backends instead (e.g. python:kernel.py:decode, plugin:lib.so)");
  table.push_back({sub, [names] { return list_backends_command(*names); }});
}

}  // namespace mlafuzz::cli
