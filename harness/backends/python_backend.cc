// The python: backend (see python_backend.h and docs/WORKER_PROTOCOL.md).
#include "harness/backends/python_backend.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/command.h"
#include "core/settings.h"
#include "core/shared_arena.h"
#include "harness/backends/ipc_channel.h"
#include "harness/backends/plugin_backend.h"
#include "harness/backends/python_replies.h"

namespace mlafuzz {

namespace build_paths {
// This source tree's python/ and kernels/ folders, defined in the source CMake generates into
// mlafuzz_backends' build folder (mlafuzz_build_paths() in cmake/mlafuzzBuildPaths.cmake).
extern const char kPythonSourceDir[];
extern const char kKernelsSourceDir[];
}  // namespace build_paths

namespace {

std::atomic<int> g_device_workers{0};  // set_python_device_workers
std::mutex g_worker_log_mu;
std::string g_worker_log;  // set_python_worker_log

using json = nlohmann::json;

// docs/WORKER_PROTOCOL.md: the Python worker's version and message types.
constexpr int kProtocolVersion = 3;
constexpr uint32_t kMsgInfo = 1, kMsgSupports = 2, kMsgRun = 3, kMsgQuit = 4, kMsgError = 5;
constexpr double kStartTimeoutS = 120;  // importing torch and initializing CUDA is slow
// What the interpreter runs (`python -c` this, then the worker's arguments): mlafuzz._worker's
// main, or, when the interpreter cannot import the package or numpy, one ERROR frame naming the
// missing module (frame layout: docs/WORKER_PROTOCOL.md) instead of a traceback among the
// progress lines. Only the standard library runs before the import; `-m mlafuzz._worker` could
// not catch that error, since running a package's module imports the package first.
constexpr const char* kWorkerBootstrap = R"py(import os, struct, sys
try:
    from mlafuzz.worker.server import main
except ImportError as e:
    name = e.name or str(e)
    what = ("the mlafuzz Python package" if name.split(".")[0] == "mlafuzz" else
            f"the module {name!r}, which the mlafuzz Python package needs")
    m = (f"{sys.executable} cannot import {what} ({e}); choose an interpreter that has numpy "
         "and the package with --python PATH or MLAFUZZ_PYTHON (on Debian: /usr/bin/python3)"
         ).encode()
    os.write(1, struct.pack("<IIQ", 0x57414C4D, 5, len(m)) + m)
    sys.exit(4)
sys.exit(main(sys.argv[1:]))
)py";

bool executable_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

bool regular_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The folder of the running executable (so an installed or copied tree finds its own files).
std::string executable_dir() {
  const std::string exe = executable_path();
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "" : exe.substr(0, slash);
}

// The folder holding the mlafuzz Python package: MLAFUZZ_PYTHON_PACKAGE_DIR, else the Python
// package this executable was installed in by `pip install .` (<package>/_native/bin/mlafuzz:
// the folder above <package>), else the installed tree's share/mlafuzz/python beside the
// executable, else this source tree's python/.
std::string package_dir() {
  if (auto e = settings::text("MLAFUZZ_PYTHON_PACKAGE_DIR")) return *e;
  if (const std::string exe = executable_dir(); !exe.empty()) {
    if (regular_file(exe + "/../../_worker.py")) {
      std::error_code ec;
      const auto dir = std::filesystem::weakly_canonical(exe + "/../../..", ec);
      if (!ec) return dir.string();
    }
    const std::string dir = exe + "/../share/mlafuzz/python";
    if (regular_file(dir + "/mlafuzz/_worker.py")) return dir;
  }
  const std::string dir = build_paths::kPythonSourceDir;
  if (regular_file(dir + "/mlafuzz/_worker.py")) return dir;
  return "";
}

const char* layout_str(int32_t l) { return l == MLAFUZZ_LAYOUT_MODEL1 ? "model1" : "v32"; }

// The call's scalar fields, under MlafuzzDecodeCall's names (strings for enumerations).
json scalars(const MaterializedCase& m) {
  const mla::DecodeParams p = m.host_params();  // every stride of the case, outputs included
  const MlafuzzDecodeCall c = make_plugin_call(p, MLAFUZZ_RUNS_ON_HOST, nullptr);
  json j{
      {"layout", layout_str(c.layout)},
      {"nope_dim", c.nope_dim},
      {"rope_dim", c.rope_dim},
      {"scale_tile", c.scale_tile},
      {"page_size", c.page_size},
      {"num_pages", c.num_pages},
      {"page_stride", c.page_stride},
      {"kv_cache_bytes", c.kv_cache_bytes},
      {"token_bytes", c.token_bytes},
      {"d_qk", c.d_qk},
      {"d_v", c.d_v},
      {"invalid_index_rule",
       c.invalid_index_rule == MLAFUZZ_INVALID_MINUS_ONE_ONLY ? "minus_one_only"
       : c.invalid_index_rule == MLAFUZZ_INVALID_ANY_NEGATIVE ? "any_negative"
                                                              : "out_of_range"},
      {"empty_row_lse", c.empty_row_lse == MLAFUZZ_EMPTY_LSE_POS_INF ? "+inf" : "-inf"},
      {"sink_in_lse", c.sink_in_lse != 0},
      {"batch", c.batch},
      {"heads", c.heads},
      {"topk", c.topk},
      {"sm_scale", static_cast<double>(c.sm_scale)},  // exact: a float widened
      {"q_head_stride", c.q_head_stride},
      {"q_batch_stride", c.q_batch_stride},
      {"indices_batch_stride", c.indices_batch_stride},
      {"out_head_stride", c.out_head_stride},
      {"out_batch_stride", c.out_batch_stride},
      {"lse_batch_stride", c.lse_batch_stride},
      {"has_topk_length", c.topk_length != nullptr},
      {"has_sink", c.sink != nullptr},
      // ABI version 2 (docs/SPEC.md section 8): query tokens and the extra cache.
      {"s_q", c.s_q},
      {"q_token_stride", c.q_token_stride},
      {"indices_token_stride", c.indices_token_stride},
      {"out_token_stride", c.out_token_stride},
      {"lse_token_stride", c.lse_token_stride},
      {"has_extra", c.has_extra != 0},
  };
  if (c.has_extra != 0) {
    j["extra_page_size"] = c.extra_page_size;
    j["extra_num_pages"] = c.extra_num_pages;
    j["extra_page_stride"] = c.extra_page_stride;
    j["extra_kv_cache_bytes"] = c.extra_kv_cache_bytes;
    j["extra_topk"] = c.extra_topk;
    j["extra_indices_batch_stride"] = c.extra_indices_batch_stride;
    j["extra_indices_token_stride"] = c.extra_indices_token_stride;
    j["has_extra_topk_length"] = !m.extra_topk_length.empty();
  }
  return j;
}

// The leading dims (and byte strides) of a [B, s_q, ...] array: [B, ...] when s_q = 1, the
// shapes of version 1.
void token_dims(const MaterializedCase& m, int64_t batch_stride, int64_t token_stride, int64_t elem,
                std::vector<int64_t>& shape, std::vector<int64_t>& strides) {
  shape.insert(shape.begin(), m.batch);
  strides.insert(strides.begin(), elem * batch_stride);
  if (m.s_q > 1) {
    shape.insert(shape.begin() + 1, m.s_q);
    strides.insert(strides.begin() + 1, elem * token_stride);
  }
}

// Where each buffer of a call lies, described for numpy: [offset, shape, strides in bytes, dtype,
// region(, base)]. Inputs already in the shared arena (core/shared_arena.h) are read there
// (region "arena", no copy); the others, and the outputs, get a place in the call's shared
// memory (region "shm", 64-byte aligned), inputs copied in by copy_in().
class CallLayout {
 public:
  // Where a buffer of the call lies: its offset in its region and, for an input in the arena, the
  // buffer's name (the descriptors of the layout line are relative to it; the call line says
  // where it starts this time).
  struct Where {
    int64_t offset;
    const char* region;
    const char* base = nullptr;
  };
  // The input named `name`: in the arena where materialize() put it, else copied into fd 3.
  Where input(const char* name, const void* data, size_t bytes) {
    if (SharedArena* a = SharedArena::get(); a != nullptr && bytes > 0) {
      if (const int64_t off = a->offset_of(data, bytes); off >= 0) return {off, "arena", name};
    }
    const int64_t off = place(bytes);
    copies_.push_back({off, data, bytes});
    return {off, "shm"};
  }
  // An output the worker writes: its offset in the call's shared memory.
  int64_t output(size_t bytes) { return place(bytes); }
  size_t bytes() const { return static_cast<size_t>(next_); }
  void copy_in(uint8_t* base) const {
    for (const auto& p : copies_) {
      if (p.bytes > 0) std::memcpy(base + p.offset, p.src, p.bytes);
    }
  }

 private:
  int64_t place(size_t bytes) {
    const int64_t off = next_;
    next_ = (off + static_cast<int64_t>(bytes) + 63) / 64 * 64;
    return off;
  }
  struct Copy {
    int64_t offset;
    const void* src;
    size_t bytes;
  };
  std::vector<Copy> copies_;
  int64_t next_ = 0;
};

using Where = CallLayout::Where;

// A descriptor of the layout line: an arena input's offset is relative to its buffer (the call
// line's "bases" gives the start), so that the same geometry repeats the same bytes.
json desc(const Where& w, std::vector<int64_t> shape, std::vector<int64_t> strides,
          const char* dtype, int64_t delta = 0) {
  if (w.base != nullptr) return json::array({delta, shape, strides, dtype, w.region, w.base});
  return json::array({w.offset + delta, shape, strides, dtype, w.region});
}

// MLAFUZZ_DEVICE_CACHE=0: no identities in requests, so a device="cuda" worker copies every
// input to the device on every call (and uploads the canaries): no device cache.
bool device_cache_enabled() { return settings::flag("MLAFUZZ_DEVICE_CACHE", true); }

// Described by the worker's INFO reply at the first start (PythonDescription::traits).
class PythonBackend final : public TraitsBackend<Backend> {
 public:
  explicit PythonBackend(std::string backend_name)
      : backend_(std::move(backend_name)), spec_(backend_.substr(std::strlen(kPythonPrefix))) {
    const std::string error = start(&desc_);
    if (!error.empty()) throw PythonBackendError(error);
    traits_ = desc_.traits;
  }
  ~PythonBackend() override { child_.stop(kMsgQuit); }

  const PythonDescription& description() const { return desc_; }

  std::optional<std::string> unsupported(const MaterializedCase& m) const override {
    if (!desc_.has_supports) return std::nullopt;
    const std::lock_guard<std::mutex> lock(mu_);
    return verdict(scalars(m).dump());
  }

 protected:
  // A case that unsupported() accepted (run_batch asks it first).
  RunResult run_case(const MaterializedCase& m) override {
    const std::lock_guard<std::mutex> lock(mu_);
    return run_locked(m, scalars(m));
  }

 private:
  // supports()' verdict on a request of scalars (mu_ held).
  std::optional<std::string> verdict(const std::string& req) const {
    if (!child_.running() && !start().empty()) return std::nullopt;  // the run records the fault
    // supports() sees the scalar fields only (its arrays are None: the contract), so its verdict
    // on one request holds for every case with the same fields: a campaign's property variants
    // would otherwise cost a round trip each.
    if (const auto hit = verdicts_.find(req); hit != verdicts_.end()) return hit->second;
    const ipc::Child::Reply r = child_.call(kMsgSupports, req, python_call_timeout());
    if (!r.fault.empty() || r.type != kMsgSupports) return std::nullopt;  // not kept: the run sees
    std::optional<std::string> verdict;
    try {
      const PythonSupportsReply reply = read_python_supports_reply(fields::Json::parse(r.payload));
      if (reply.reason) verdict = backend_ + ": " + *reply.reason;
    } catch (const std::exception&) {  // a malformed reply: taken, not kept (as a fault)
      return std::nullopt;
    }
    if (verdicts_.size() >= kMaxVerdicts) verdicts_.clear();
    verdicts_.emplace(req, verdict);
    return verdict;
  }

  // run() with mu_ held and the call's scalars built (req).
  RunResult run_locked(const MaterializedCase& m, json req) {
    if (!child_.running()) {
      if (const std::string e = start(); !e.empty()) return fault("worker restart failed: " + e);
    }
    const bool device_cache = desc_.device == "cuda" && device_cache_enabled();
    const auto bytes_of = [](const auto& v) { return v.size() * sizeof(v[0]); };
    CallLayout layout;
    const Where q_in = layout.input("q_raw", m.q.data(), bytes_of(m.q));
    const Where kv_in = layout.input("kv_cache", m.cache.data(), bytes_of(m.cache));
    const Where idx_in = layout.input("indices_raw", m.indices.data(), bytes_of(m.indices));
    const Where len_in = layout.input("topk_length", m.topk_length.data(), bytes_of(m.topk_length));
    const Where sink_in = layout.input("sink", m.sink.data(), bytes_of(m.sink));
    const Where xkv_in =
        layout.input("extra_kv_cache", m.extra_cache.data(), bytes_of(m.extra_cache));
    const Where xidx_in =
        layout.input("extra_indices", m.extra_indices.data(), bytes_of(m.extra_indices));
    const Where xlen_in = layout.input("extra_topk_length", m.extra_topk_length.data(),
                                       bytes_of(m.extra_topk_length));
    const size_t out_n = OutputBuffers::out_elements(m), lse_n = OutputBuffers::lse_elements(m);
    const int64_t out_off = layout.output(out_n * sizeof(uint16_t));
    const int64_t lse_off = layout.output(lse_n * sizeof(float));
    try {
      shm_->reserve(layout.bytes());
    } catch (const std::exception& e) {
      RunResult r;
      r.status = RunStatus::kError;
      r.message = backend_ + ": " + e.what();
      return r;
    }
    layout.copy_in(shm_->data());
    auto* out_raw = reinterpret_cast<uint16_t*>(shm_->data() + out_off);
    auto* lse_raw = reinterpret_cast<float*>(shm_->data() + lse_off);
    // The canaries go straight into the shared memory: no buffer to fill and copy over. A device
    // cache worker fills its device outputs with them and copies the whole buffers back.
    if (!device_cache) OutputBuffers::fill_canaries(out_raw, out_n, lse_raw, lse_n);

    const int64_t B = m.batch, H = m.heads, G = OutputBuffers::kGuard;
    // Every view carries the real strides: row gaps and head gaps stay outside the views.
    const int64_t qhs = m.q_head_stride, ohs = m.out_head_stride;
    const Where out_at{out_off, "shm"}, lse_at{lse_off, "shm"};
    // [B, (s_q,) ...] views: the s_q axis when s_q > 1.
    auto tokens = [&](const Where& at, std::vector<int64_t> shape, std::vector<int64_t> strides,
                      int64_t batch_stride, int64_t token_stride, int64_t elem, const char* t,
                      int64_t delta = 0) {
      token_dims(m, batch_stride, token_stride, elem, shape, strides);
      return desc(at, std::move(shape), std::move(strides), t, delta);
    };
    json arrays = {
        {"q",
         tokens(q_in, {H, m.d_qk()}, {2 * qhs, 2}, m.q_batch_stride, m.q_token_stride, 2, "u2")},
        {"q_raw", desc(q_in, {static_cast<int64_t>(m.q.size())}, {2}, "u2")},
        {"kv_cache",
         desc(kv_in, {m.geom.num_pages, m.geom.page_stride}, {m.geom.page_stride, 1}, "u1")},
        {"indices",
         tokens(idx_in, {m.topk}, {4}, m.indices_batch_stride, m.indices_token_stride, 4, "i4")},
        {"indices_raw", desc(idx_in, {static_cast<int64_t>(m.indices.size())}, {4}, "i4")},
        {"out", tokens(out_at, {H, m.d_v()}, {2 * ohs, 2}, m.out_batch_stride, m.out_token_stride,
                       2, "u2", 2 * G)},
        {"out_raw", desc(out_at, {static_cast<int64_t>(out_n)}, {2}, "u2")},
        {"lse", tokens(lse_at, {H}, {4}, m.lse_batch_stride, m.lse_token_stride, 4, "f4", 4 * G)},
        {"lse_raw", desc(lse_at, {static_cast<int64_t>(lse_n)}, {4}, "f4")},
    };
    if (!m.topk_length.empty()) arrays["topk_length"] = desc(len_in, {B}, {4}, "i4");
    if (!m.sink.empty()) arrays["sink"] = desc(sink_in, {H}, {4}, "f4");
    if (m.has_extra) {
      const mla::CacheGeometry& e = m.extra_geom;
      arrays["extra_kv_cache"] =
          desc(xkv_in, {e.num_pages, e.page_stride}, {e.page_stride, 1}, "u1");
      arrays["extra_indices"] = tokens(xidx_in, {m.extra_topk}, {4}, m.extra_indices_batch_stride,
                                       m.extra_indices_token_stride, 4, "i4");
      if (!m.extra_topk_length.empty()) {
        arrays["extra_topk_length"] = desc(xlen_in, {B}, {4}, "i4");
      }
    }
    req["arrays"] = std::move(arrays);
    req["out_guard"] = G;
    req["lse_guard"] = G;
    // The call line (docs/WORKER_PROTOCOL.md, protocol 3): what differs between calls of the
    // same geometry, so that the layout line above repeats byte for byte.
    json per_call{{"shm_size", shm_->size()}};
    json bases = json::object();
    for (const Where* w :
         {&q_in, &kv_in, &idx_in, &len_in, &sink_in, &xkv_in, &xidx_in, &xlen_in}) {
      if (w->base != nullptr) bases[w->base] = w->offset;
    }
    if (!bases.empty()) per_call["bases"] = std::move(bases);
    if (device_cache) {
      // Identities of the inputs read in the arena (SharedArena::publish; they seal the blocks):
      // the worker keeps device copies by identity and copies only what it has not seen.
      json ids = json::object();
      SharedArena* a = SharedArena::get();
      const auto identify = [&](const Where& at, const void* data, size_t bytes) {
        if (a == nullptr || at.base == nullptr) return;  // not in the arena: no identity
        if (const uint64_t id = a->publish(data, bytes); id != 0) ids[at.base] = id;
      };
      identify(q_in, m.q.data(), bytes_of(m.q));
      identify(kv_in, m.cache.data(), bytes_of(m.cache));
      identify(xkv_in, m.extra_cache.data(), bytes_of(m.extra_cache));
      per_call["ids"] = std::move(ids);
      // The canaries' bits: the worker fills its device outputs with them instead of uploading.
      req["out_canary"] = OutputBuffers::kCanaryBits;
      req["lse_canary"] = OutputBuffers::kLseCanaryBits;
    }
    std::string payload = req.dump();
    payload.push_back('\n');
    payload += per_call.dump();

    const ipc::Child::Reply reply = child_.call(kMsgRun, payload, python_call_timeout());
    if (!reply.fault.empty()) return fault(reply.fault);
    if (reply.type != kMsgRun) {
      return fault(child_.kill_and_describe(
          "sent an unexpected reply: " +
          (reply.type == kMsgError ? reply.payload : reply.payload.substr(0, 200))));
    }
    PythonRunReply run;
    try {
      run = read_python_run_reply(fields::Json::parse(reply.payload));
    } catch (const std::exception& e) {
      return fault(child_.kill_and_describe(std::string("sent a malformed reply (") + e.what() +
                                            "): " + reply.payload.substr(0, 200)));
    }
    if (run.status == PythonRunReply::Status::kFault) {
      // A CUDA error: the worker exits (its context is poisoned); reap it.
      return fault(child_.kill_and_describe("reported a device fault") + ": " + run.message);
    }
    if (run.status == PythonRunReply::Status::kError) {
      RunResult r;
      r.status = RunStatus::kError;
      r.message =
          backend_ + ": the kernel raised an exception:\n" + run.message + undeclared_hint(m);
      r.seconds = run.seconds;
      return r;
    }
    RunResult r = collect_outputs(m, OutputBuffers(m, out_raw, lse_raw));
    r.seconds = run.seconds;  // the kernel's own time, measured in the worker
    return r;
  }

  // For a kernel that raised on a case of the production decode without declaring whether it
  // takes one: what to declare if it does not (else "").
  std::string undeclared_hint(const MaterializedCase& m) const {
    const Envelope& e = traits_.envelope;
    if (m.has_extra && !e.refuses_feature(kFeatureExtraCache) && !desc_.declares_extra_cache) {
      return "\nthis case has an extra cache; declare mlafuzz.Envelope(extra_cache=False) if "
             "your kernel does not take one";
    }
    if (m.s_q > 1 && !e.s_q.constrained()) {
      return "\nthis case has s_q = " + std::to_string(m.s_q) +
             " query tokens per batch row; declare mlafuzz.Envelope(s_q=1) if your kernel takes "
             "one";
    }
    return "";
  }

  RunResult fault(const std::string& message) const {
    RunResult r;
    r.status = RunStatus::kFault;
    r.message = message;
    return r;
  }

  // Starts the worker and checks what it serves; returns "" or what went wrong. `described`:
  // where to keep what the kernel declares (the first start; a restart serves the same kernel).
  std::string start(PythonDescription* described = nullptr) const {
    std::string interpreter;
    try {
      interpreter = python_interpreter();
      if (!shm_) shm_ = std::make_unique<ipc::SharedMemory>("mlafuzz-python");
    } catch (const std::exception& e) {
      return e.what();
    }
    ipc::ChildSpec spec;
    spec.argv = {interpreter,
                 "-c",
                 kWorkerBootstrap,
                 "--backend",
                 spec_,
                 "--shm-fd",
                 std::to_string(ipc::kChildShmFd),
                 "--protocol",
                 std::to_string(kProtocolVersion)};
    spec.shm_fd = shm_->fd();
    if (const SharedArena* a = SharedArena::get()) {
      spec.arena_fd = a->read_only_fd();
      spec.argv.insert(spec.argv.end(), {"--arena-fd", std::to_string(ipc::kChildArenaFd)});
    }
    spec.label = "python worker for " + backend_;
    {
      std::lock_guard<std::mutex> lock(g_worker_log_mu);
      spec.log_path = g_worker_log;
    }
    spec.env.push_back("PYTHONUNBUFFERED=1");
    if (const int n = g_device_workers.load(); n > 0 && !settings::text("MLAFUZZ_DEVICE_WORKERS")) {
      spec.env.push_back("MLAFUZZ_DEVICE_WORKERS=" + std::to_string(n));
    }
    if (const std::string dir = package_dir(); !dir.empty()) {
      std::string path = "PYTHONPATH=" + dir;
      if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old) {
        path.append(1, ':').append(old);
      }
      spec.env.push_back(path);
    }
    try {
      child_.start(spec);
    } catch (const std::exception& e) {
      return spec.label + ": " + e.what();
    }
    const json hello = {{"protocol", kProtocolVersion}};
    const ipc::Child::Reply r = child_.call(kMsgInfo, hello.dump(), kStartTimeoutS);
    const std::string how = interpreter + " -m mlafuzz._worker";
    if (!r.fault.empty()) {
      return r.fault + "; " + how +
             " did not answer: can that interpreter import the mlafuzz package and numpy? "
             "(pip install ./python, or set PYTHONPATH; choose another interpreter with "
             "--python PATH or MLAFUZZ_PYTHON; its stderr " +
             (spec.log_path.empty() ? std::string("above") : "in " + spec.log_path) + " says more)";
    }
    if (r.type == kMsgError) {
      child_.stop(0);
      return r.payload;
    }
    const auto j = fields::Json::parse(r.payload, nullptr, false);
    if (r.type != kMsgInfo || !j.is_object() || !j.contains("protocol") ||
        j.at("protocol") != kProtocolVersion) {
      child_.stop(0);
      return spec.label + ": the worker speaks another protocol version (this mlafuzz speaks " +
             std::to_string(kProtocolVersion) +
             "); install the matching package: pip install "
             "./python";
    }
    try {
      PythonInfo info = read_python_info(j, backend_, interpreter);
      if (described != nullptr) *described = std::move(info.description);
    } catch (const std::exception& e) {  // FieldError, the envelope's invalid_argument
      child_.stop(0);
      return backend_ + ": malformed info from the worker: " + e.what();
    }
    return "";
  }

  std::string backend_, spec_;
  // Mutable: unsupported() is const in Backend but talks to (and may restart) the worker.
  mutable std::mutex mu_;
  // supports() verdicts by the request's scalar JSON (cleared when full).
  static constexpr size_t kMaxVerdicts = 4096;
  mutable std::unordered_map<std::string, std::optional<std::string>> verdicts_;
  mutable ipc::Child child_;
  mutable std::unique_ptr<ipc::SharedMemory> shm_;
  PythonDescription desc_;
};

// A shipped kernel under its short name; the python: backend inside does the work. Its traits
// are the kernel's (envelope, invariance claims, tolerances, extra pipeline, token tile: a
// campaign on triton-mma draws inside the kernel's envelope) with the alias's name, SIMT partner
// and device; a kernel that cannot be loaded leaves the declared precision and why it is
// unavailable.
class ShippedPythonBackend final : public TraitsBackend<Backend> {
 public:
  ShippedPythonBackend(std::string alias, const std::string& file, const std::string& func,
                       Precision declared, std::string partner, bool strict) {
    traits_.precision = declared;
    const std::string dir = shipped_python_kernel_dir("triton", file);
    if (dir.empty()) {
      traits_.availability = {
          false, "kernel file " + file +
                     " not found (looked in $MLAFUZZ_TRITON_DIR, "
                     "<executable>/../share/mlafuzz/triton and the source tree's kernels/triton)"};
      if (strict) throw PythonBackendError(alias + ": " + traits_.availability.reason);
    } else {
      try {
        inner_ = std::make_unique<PythonBackend>(std::string(kPythonPrefix) + dir + "/" + file +
                                                 ":" + func);
        traits_ = inner_->traits();
      } catch (const std::exception& e) {
        if (strict) throw;
        traits_.availability = {false, e.what()};
      }
    }
    traits_.name = std::move(alias);
    traits_.simt_partner = std::move(partner);
    traits_.on_device = true;
    traits_.needs_worker = true;
  }

  std::optional<std::string> unsupported(const MaterializedCase& m) const override {
    return inner_ ? inner_->unsupported(m) : std::nullopt;
  }

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    if (inner_) {  // the kernel's raw outputs, converted by this backend's run_batch
      RunOptions raw;
      raw.raw_outputs = true;
      return inner_->run(m, raw);
    }
    RunResult r;
    r.status = RunStatus::kError;
    r.message = traits_.name + " is not available: " + traits_.availability.reason;
    return r;
  }

 private:
  std::unique_ptr<PythonBackend> inner_;
};

}  // namespace

std::string shipped_python_kernel_dir(const std::string& kind, const std::string& file) {
  std::vector<std::string> dirs;
  if (auto e = settings::text("MLAFUZZ_TRITON_DIR"); e && kind == "triton") dirs.push_back(*e);
  if (const std::string exe = executable_dir(); !exe.empty()) {
    dirs.push_back(exe + "/../share/mlafuzz/" + kind);
  }
  dirs.push_back(std::string(build_paths::kKernelsSourceDir) + "/" + kind);
  for (const std::string& d : dirs) {
    if (regular_file(d + "/" + file)) return d;
  }
  return "";
}

std::unique_ptr<Backend> make_shipped_python_backend(const std::string& alias,
                                                     const std::string& file,
                                                     const std::string& func, Precision declared,
                                                     const std::string& simt_partner, bool strict) {
  return std::make_unique<ShippedPythonBackend>(alias, file, func, declared, simt_partner, strict);
}

std::string python_interpreter() {
  const std::string name = settings::text("MLAFUZZ_PYTHON").value_or("python3");
  const std::string how = "choose one with --python PATH or MLAFUZZ_PYTHON";
  if (name.find('/') != std::string::npos) {
    if (executable_file(name)) return name;
    throw PythonBackendError("python interpreter " + name + " is not an executable file; " + how);
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable_file(candidate)) return candidate;
  }
  throw PythonBackendError("python interpreter '" + name + "' not found on PATH; " + how);
}

double python_call_timeout() { return settings::seconds("MLAFUZZ_PYTHON_TIMEOUT", 60); }

std::string python_call_fields(const MaterializedCase& m) { return scalars(m).dump(); }

std::unique_ptr<Backend> make_python_backend(const std::string& backend_name) {
  return std::make_unique<PythonBackend>(backend_name);
}

void set_python_device_workers(int n) { g_device_workers.store(n); }

void set_python_worker_log(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_worker_log_mu);
  g_worker_log = path;
}

PythonDescription describe_python_backend(const std::string& backend_name) {
  const PythonBackend b(backend_name);
  return b.description();
}

}  // namespace mlafuzz
