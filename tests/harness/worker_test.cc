// Fault isolation: the wire format, and a real `mlafuzz worker` behind a ProxyBackend giving
// the same bits as the in-process backend, turning a crash, an abort, a hang and a sticky
// device error into RunStatus::kFault, and restarting.
#include "harness/campaign/worker.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/backend.h"
#include "core/envelope.h"
#include "core/materialize.h"
#include "core/rng.h"
#include "core/shared_arena.h"
#include "harness/backends/device_query.h"
#include "harness/backends/python_backend.h"
#include "harness/backends/registry.h"
#include "harness/campaign/isolation.h"
#include "harness/campaign/worker_protocol.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "properties/properties.h"
#include "tests/core/build_paths.h"

namespace mlafuzz::campaign {
namespace {

MaterializedCase small_case(int heads) {
  GenConfig cfg;
  for (uint64_t i = 0;; ++i) {
    Case c = generate_case(5, i, cfg, nullptr);
    try {
      validate(c);
    } catch (const std::exception&) {
      continue;
    }
    if (c.batch * c.heads * c.topk > 4096) continue;
    c.heads = heads;
    if (c.sink) c.sink->assign(heads, 0.5);
    return materialize(c);
  }
}

// Large vectors travel through the shared memory (the bulk area), small and empty ones inline;
// the frame alone then holds no cache bytes, and a reader without the area refuses it.
TEST(WorkerProtocol, LargeVectorsTravelThroughTheBulkArea) {
  const MaterializedCase m = small_case(3);
  ASSERT_GE(m.cache.size(), 4096u);
  std::vector<uint8_t> area(bulk_bytes_needed(m));
  BulkArea bulk{area.data(), area.size(), 0};
  const std::string frame = encode_case(m, &bulk);
  EXPECT_GE(bulk.used, m.cache.size());
  EXPECT_LT(frame.size(), m.cache.size());
  const MaterializedCase back = decode_case(frame, &bulk);
  EXPECT_EQ(back.q, m.q);
  EXPECT_EQ(back.cache, m.cache);
  EXPECT_EQ(back.indices, m.indices);
  EXPECT_THROW(decode_case(frame), ProtocolError);
  RunResult r;
  r.out.assign(static_cast<size_t>(m.batch) * m.heads * m.d_v(), 0.25);  // out of line
  r.lse = {};                                                            // empty, inline
  BulkArea reply{area.data(), area.size(), 0};
  const RunResult rb = decode_result(encode_result(r, &reply), &reply);
  EXPECT_EQ(rb.out, r.out);
  EXPECT_TRUE(rb.lse.empty());
  // An area too small for a vector: it goes inline instead.
  BulkArea tiny{area.data(), 16, 0};
  const MaterializedCase inline_back = decode_case(encode_case(m, &tiny), &tiny);
  EXPECT_EQ(inline_back.cache, m.cache);
}

TEST(WorkerProtocol, CaseAndResultRoundTrip) {
  const MaterializedCase m = small_case(3);
  const MaterializedCase back = decode_case(encode_case(m));
  EXPECT_EQ(back.q, m.q);
  EXPECT_EQ(back.cache, m.cache);
  EXPECT_EQ(back.indices, m.indices);
  EXPECT_EQ(back.topk_length, m.topk_length);
  EXPECT_EQ(back.sink, m.sink);
  EXPECT_EQ(back.heads, 3);
  EXPECT_EQ(back.geom.page_stride, m.geom.page_stride);
  EXPECT_EQ(back.sm_scale, m.sm_scale);
  // The recipe stays with the campaign; what describes the buffers travels.
  EXPECT_EQ(back.recipe.geom.page_stride, m.geom.page_stride);
  EXPECT_EQ(back.recipe.heads, 3);
  RunResult r;
  r.status = RunStatus::kError;
  r.message = "launch failed";
  r.out = {1.5, -2.0};
  r.lse = {INFINITY};
  r.out_raw = {1, 2, 3};
  r.lse_raw = {0.5f};
  r.guard_violations = 2;
  const RunResult rb = decode_result(encode_result(r));
  EXPECT_EQ(rb.status, RunStatus::kError);
  EXPECT_EQ(rb.message, r.message);
  EXPECT_EQ(rb.out, r.out);
  EXPECT_EQ(rb.out_raw, r.out_raw);
  EXPECT_EQ(rb.guard_violations, 2);
  std::string truncated = encode_result(r);
  truncated.pop_back();
  EXPECT_THROW(decode_result(truncated), ProtocolError);
}

// Every vector of a frame empty (a result with no output, a case stripped of its buffers): the
// decoder must not hand a null data() to memcpy (caught by the sanitized build, docs/testing.md).
TEST(WorkerProtocol, EmptyVectorsRoundTrip) {
  MaterializedCase m = small_case(2);
  m.q.clear();
  m.cache.clear();
  m.indices.clear();
  m.topk_length.clear();
  m.sink.clear();
  const MaterializedCase back = decode_case(encode_case(m));
  EXPECT_TRUE(back.q.empty());
  EXPECT_TRUE(back.cache.empty());
  EXPECT_TRUE(back.indices.empty());
  EXPECT_TRUE(back.topk_length.empty());
  EXPECT_TRUE(back.sink.empty());
  EXPECT_EQ(back.heads, 2);
  EXPECT_EQ(back.q_head_stride, m.q_head_stride);
  EXPECT_EQ(back.out_head_stride, m.out_head_stride);

  RunResult r;  // as a backend that failed before writing anything replies
  r.status = RunStatus::kFault;
  r.message = "no output";
  const RunResult rb = decode_result(encode_result(r));
  EXPECT_EQ(rb.status, RunStatus::kFault);
  EXPECT_EQ(rb.message, "no output");
  EXPECT_TRUE(rb.out.empty());
  EXPECT_TRUE(rb.lse.empty());
  EXPECT_TRUE(rb.out_raw.empty());
  EXPECT_TRUE(rb.lse_raw.empty());
}

// Protocol 2: a worker (raw outputs) sends the raw buffers only; widen_raw_outputs on the
// campaign side gives the same out, lse and guard count as widening them in the worker did.
TEST(WorkerProtocol, RawOutputsAreWidenedOnTheCampaignSideBitForBit) {
  const MaterializedCase m = small_case(3);
  OutputBuffers bufs(m);
  uint64_t x = 12345;
  for (int64_t b = 0; b < m.batch; ++b) {  // every body element some bf16 (NaNs included)
    for (int64_t h = 0; h < m.heads; ++h) {
      uint16_t* row = bufs.out_begin() + b * bufs.out_batch_stride + h * bufs.out_head_stride;
      for (int32_t d = 0; d < m.d_v(); ++d) row[d] = static_cast<uint16_t>((x = splitmix64(x)));
      bufs.lse_begin()[b * bufs.lse_batch_stride + h] = static_cast<float>(b - h) * 0.5f;
    }
  }
  bufs.out[1] = 0;  // a guard element written: one violation
  RunResult want = collect_outputs(m, bufs);
  finish_outputs(m, want, /*raw_outputs=*/false);
  ASSERT_EQ(want.guard_violations, 1);
  const RunResult pending = collect_outputs(m, bufs);
  EXPECT_TRUE(pending.outputs_pending);
  EXPECT_TRUE(pending.out.empty());
  EXPECT_TRUE(pending.lse.empty());
  std::vector<uint8_t> area(bulk_bytes_needed(m));
  BulkArea bulk{area.data(), area.size(), 0};
  RunResult got = decode_result(encode_result(pending, &bulk), &bulk);
  ASSERT_TRUE(got.outputs_pending);
  widen_raw_outputs(m, got);
  EXPECT_FALSE(got.outputs_pending);
  ASSERT_EQ(got.out.size(), want.out.size());
  EXPECT_EQ(0, std::memcmp(got.out.data(), want.out.data(), want.out.size() * 8));
  ASSERT_EQ(got.lse.size(), want.lse.size());
  EXPECT_EQ(0, std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * 8));
  EXPECT_EQ(got.guard_violations, 1);
  EXPECT_EQ(got.out_raw, want.out_raw);
  // Raw buffers of the wrong size (a broken worker) are a fault, not a read out of bounds.
  RunResult bad = pending;
  bad.out_raw.pop_back();
  widen_raw_outputs(m, bad);
  EXPECT_EQ(bad.status, RunStatus::kFault);
  EXPECT_NE(bad.message.find("raw outputs"), std::string::npos) << bad.message;
}

// check_raw_outputs (lazy widening, RunOptions::raw_outputs): a pending result keeps the guard
// count collect_outputs made and its raw buffers only; widening it later gives the same bits.
TEST(WorkerProtocol, RawCheckKeepsTheGuardCountAndLeavesTheWideningForLater) {
  const MaterializedCase m = small_case(3);
  OutputBuffers bufs(m);
  for (int64_t b = 0; b < m.batch; ++b) {
    for (int64_t h = 0; h < m.heads; ++h) {
      uint16_t* row = bufs.out_begin() + b * bufs.out_batch_stride + h * bufs.out_head_stride;
      for (int32_t d = 0; d < m.d_v(); ++d) row[d] = static_cast<uint16_t>(0x3f80 + d + h);
      bufs.lse_begin()[b * bufs.lse_batch_stride + h] = static_cast<float>(b + h);
    }
  }
  bufs.out[2] = 0;
  bufs.lse[bufs.lse.size() - 1] = 1.0f;  // two guard elements written
  RunResult want = collect_outputs(m, bufs);
  finish_outputs(m, want, /*raw_outputs=*/false);
  ASSERT_EQ(want.guard_violations, 2);
  RunResult got = collect_outputs(m, bufs);
  finish_outputs(m, got, /*raw_outputs=*/true);
  EXPECT_TRUE(got.outputs_pending);
  EXPECT_TRUE(got.out.empty());
  EXPECT_EQ(got.guard_violations, 2);
  EXPECT_EQ(got.out_raw, want.out_raw);
  std::string where;
  EXPECT_TRUE(bitwise_equal(m, want, got, &where)) << where;  // on the raw buffers
  widen_raw_outputs(m, got);
  EXPECT_FALSE(got.outputs_pending);
  EXPECT_EQ(0, std::memcmp(got.out.data(), want.out.data(), want.out.size() * 8));
  EXPECT_EQ(got.guard_violations, 2);
  RunResult bad = collect_outputs(m, bufs);
  bad.outputs_pending = true;
  bad.lse_raw.pop_back();
  check_raw_outputs(m, bad);
  EXPECT_EQ(bad.status, RunStatus::kFault);
  EXPECT_NE(bad.message.find("raw outputs"), std::string::npos) << bad.message;
}

// The guard bands are counted once, where the worker collects the outputs: the campaign side
// (ProxyBackend::widen, widening or only checking) keeps the count the reply carries.
TEST(WorkerProtocol, TheCampaignKeepsTheWorkersGuardCount) {
  const MaterializedCase m = small_case(2);
  OutputBuffers bufs(m);
  bufs.out[0] = 0;  // one guard element written
  RunResult sent = collect_outputs(m, bufs);
  ASSERT_EQ(sent.guard_violations, 1);
  sent.guard_violations = 5;  // a count the guard bands do not show: a recount would give 1
  for (const bool values : {true, false}) {
    RunResult got = decode_result(encode_result(sent));
    ASSERT_TRUE(got.outputs_pending);
    ProxyBackend::widen(m, got, values);
    EXPECT_EQ(got.status, RunStatus::kOk) << got.message;
    EXPECT_EQ(got.outputs_pending, !values);
    EXPECT_EQ(got.guard_violations, 5) << "values " << values;
  }
}

// Protocol 2: vectors in the parent's shared arena travel as offsets there (not copied into the
// bulk area); a worker maps the arena read-only and reads them; one without it refuses.
TEST(WorkerProtocol, ArenaVectorsTravelAsOffsets) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  Case c;
  c.batch = 4;
  c.heads = 16;
  c.topk = 64;
  c.geom.num_pages = 8;
  c.geom.page_size = 64;
  const MaterializedCase m = materialize(c);
  ASSERT_GE(a->offset_of(m.cache.data(), m.cache.size()), 0);
  std::vector<uint8_t> area(bulk_bytes_needed(m));
  BulkArea w{area.data(), area.size(), 0};
  w.use_arena = true;
  const std::string frame = encode_case(m, &w);
  EXPECT_LT(w.used, m.cache.size()) << "the cache was copied into the bulk area";
  void* ro = mmap(nullptr, a->size(), PROT_READ, MAP_SHARED | MAP_NORESERVE, a->read_only_fd(), 0);
  ASSERT_NE(ro, MAP_FAILED);
  BulkArea r{area.data(), area.size(), 0};
  r.arena = static_cast<const uint8_t*>(ro);
  r.arena_size = a->size();
  const MaterializedCase back = decode_case(frame, &r);
  EXPECT_EQ(back.cache, m.cache);
  EXPECT_EQ(back.q, m.q);
  EXPECT_EQ(back.indices, m.indices);
  BulkArea no_arena{area.data(), area.size(), 0};
  EXPECT_THROW(decode_case(frame, &no_arena), ProtocolError);
  r.arena_size = 4096;  // an offset past the mapping
  EXPECT_THROW(decode_case(frame, &r), ProtocolError);
  munmap(ro, a->size());
}

// Backend::token_tile() crosses the worker boundary (the tolerance model of a proxied
// cuda-mma-small, or of cuda-mma on sm_120, counts 32-token tiles).
TEST(WorkerProtocol, InfoCarriesTheTokenTile) {
  WorkerInfo i;
  i.traits.name = "cpu-mma-small";
  i.traits.token_tile = 32;
  i.traits.splits_kv = true;
  const WorkerInfo back = decode_info(encode_info(i));
  EXPECT_EQ(back.traits.token_tile, 32);
  EXPECT_TRUE(back.traits.splits_kv);
  i.traits.token_tile = -1;
  EXPECT_THROW(decode_info(encode_info(i)), ProtocolError);
  EXPECT_EQ(describe_backend(*make_backend("cpu-mma-small")).traits.token_tile, 32);
  EXPECT_EQ(describe_backend(*make_backend("cpu-mma")).traits.token_tile, 0);
}

// The INFO reply carries every field of a backend's traits: what the proxy reports is what the
// backend in the worker says, field for field.
TEST(WorkerProtocol, InfoCarriesEveryTrait) {
  for (const char* name : {"oracle", "cpu-simt", "cpu-mma", "cpu-mma-small"}) {
    const auto backend = make_backend(name);
    const WorkerInfo sent = describe_backend(*backend);
    EXPECT_EQ(sent.traits, backend->traits()) << name;
    const WorkerInfo back = decode_info(encode_info(sent));
    EXPECT_EQ(back.traits, sent.traits) << name;
    EXPECT_EQ(back.pid, sent.pid) << name;
  }
  WorkerInfo custom;
  BackendTraits& t = custom.traits;
  t.name = "plugin:x";
  t.precision = Precision::kCustom;
  t.availability = {false, "no GPU"};
  t.inexact_invariants = 3;
  t.extra_pipeline = ExtraPipeline::kLseMerged;
  t.abs_tol = 1e-3;
  t.rel_tol = 2e-2;
  t.on_device = true;
  t.needs_worker = true;
  t.simt_partner = "cpu-simt";
  custom.traits.envelope.heads = IntSet{{16, 64}, 0, 0, 0};
  EXPECT_EQ(decode_info(encode_info(custom)).traits, custom.traits);
}

// A malformed traits document is a protocol error naming the field.
TEST(WorkerProtocol, InfoWithABadTraitIsRefused) {
  WorkerInfo i;
  const std::string good = encode_info(i);
  std::string bad = good;
  const std::string from = "\"precision\":\"float64\"", to = "\"precision\":\"float65\"";
  const size_t at = bad.find(from);
  ASSERT_NE(at, std::string::npos);
  bad.replace(at, from.size(), to);
  try {
    decode_info(bad);
    FAIL() << "precision float65 accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("info.precision"), std::string::npos) << e.what();
  }
}

TEST(WorkerProtocol, InfoOfAnotherProtocolVersionIsRefused) {
  WorkerInfo i;
  i.traits.name = "x";
  EXPECT_EQ(decode_info(encode_info(i)).protocol, kWorkerProtocolVersion);
  i.protocol = 1;
  try {
    decode_info(encode_info(i));
    FAIL() << "protocol 1 accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("protocol 1"), std::string::npos) << e.what();
  }
}

// A batch: vectors equal to the first case's travel as references (their bytes once per
// batch), different ones in full; decoding and lending the first case's vectors gives every
// case back.
TEST(WorkerProtocol, BatchSendsSharedVectorsOnce) {
  const MaterializedCase m = small_case(3);
  ASSERT_GE(m.cache.size(), 4096u);
  const MaterializedCase poisoned = poison_case(m, 0);  // q padding and cache bytes differ
  const MaterializedCase permuted = permute_indices(m, 7);
  ASSERT_NE(poisoned.cache, m.cache);
  const std::vector<const MaterializedCase*> cases{&m, &m, &poisoned, &permuted};
  size_t need = 0;
  for (const auto* c : cases) need += bulk_bytes_needed(*c);
  std::vector<uint8_t> area(need);
  BulkArea bulk{area.data(), area.size(), 0};
  const std::string frame = encode_batch(cases, &bulk);
  // The cache crossed twice (m's and the poisoned one), not four times.
  EXPECT_LT(bulk.used, 3 * m.cache.size());
  EXPECT_GE(bulk.used, 2 * m.cache.size());
  DecodedBatch back = decode_batch(frame, &bulk);
  ASSERT_EQ(back.cases.size(), 4u);
  EXPECT_EQ(back.same_as_first[0], 0u);
  EXPECT_NE(back.same_as_first[1] & 2u, 0u);  // the cache of the repeated case: a reference
  EXPECT_EQ(back.same_as_first[2] & 2u, 0u);  // the poisoned cache: in full
  EXPECT_NE(back.same_as_first[3] & 2u, 0u);  // permuted indices, the same cache
  EXPECT_TRUE(back.cases[1].cache.empty());
  for (size_t k = 0; k < cases.size(); ++k) {
    swap_vectors(back.cases[0], back.cases[k], back.same_as_first[k]);
    EXPECT_EQ(back.cases[k].q, cases[k]->q) << k;
    EXPECT_EQ(back.cases[k].cache, cases[k]->cache) << k;
    EXPECT_EQ(back.cases[k].indices, cases[k]->indices) << k;
    EXPECT_EQ(back.cases[k].topk_length, cases[k]->topk_length) << k;
    EXPECT_EQ(back.cases[k].sink, cases[k]->sink) << k;
    swap_vectors(back.cases[0], back.cases[k], back.same_as_first[k]);
  }
  EXPECT_EQ(back.cases[0].cache, m.cache);  // lent and given back
  // A reference outside a batch is refused, and so is a truncated batch.
  const std::string single = encode_batch({&m, &m}, nullptr);
  EXPECT_THROW(decode_case(std::string_view(single).substr(4)), ProtocolError);
  EXPECT_THROW(decode_batch(std::string_view(frame).substr(0, frame.size() - 1), &bulk),
               ProtocolError);
  // The per-case reply: an unsupported verdict, or a result.
  const CheckedRun u =
      decode_checked(encode_checked(std::string("too wide"), {}, nullptr), nullptr);
  ASSERT_TRUE(u.unsupported.has_value());
  EXPECT_EQ(*u.unsupported, "too wide");
  RunResult r;
  r.out = {0.5, 1.5};
  const CheckedRun ok = decode_checked(encode_checked(std::nullopt, r, nullptr), nullptr);
  EXPECT_FALSE(ok.unsupported.has_value());
  EXPECT_EQ(ok.result.out, r.out);
}

TEST(WorkerProtocol, PrecomputedMasksGiveTheSameFrame) {
  // ProxyBackend compares the variants with the first case outside the worker's lock
  // (batch_same_masks) and hands the masks to encode_batch: the frame must not change.
  const MaterializedCase m = small_case(3);
  const MaterializedCase poisoned = poison_case(m, 0);
  const MaterializedCase permuted = permute_indices(m, 7);
  const MaterializedCase alone = head_alone(m, 1);
  const std::vector<const MaterializedCase*> cases{&m, &m, &poisoned, &permuted, &alone};
  const std::vector<uint32_t> masks = batch_same_masks(cases);
  ASSERT_EQ(masks.size(), cases.size());
  EXPECT_EQ(masks[0], 0u);
  EXPECT_NE(masks[1] & 1u, 0u);  // the repeated case: q ...
  EXPECT_NE(masks[1] & 2u, 0u);  // ... and the cache
  EXPECT_EQ(masks[2] & 2u, 0u);  // the poisoned cache differs
  EXPECT_NE(masks[3] & 2u, 0u);  // permuted indices, the same cache
  EXPECT_EQ(masks[4] & 1u, 0u);  // one head's q is another vector
  size_t need = 0;
  for (const auto* c : cases) need += bulk_bytes_needed(*c);
  std::vector<uint8_t> area_a(need), area_b(need);
  BulkArea a{area_a.data(), area_a.size(), 0}, b{area_b.data(), area_b.size(), 0};
  const std::string compared = encode_batch(cases, &a);
  const std::string given = encode_batch(cases, &b, &masks);
  EXPECT_EQ(compared, given);
  ASSERT_EQ(a.used, b.used);
  EXPECT_EQ(0, std::memcmp(area_a.data(), area_b.data(), a.used));
  const DecodedBatch back = decode_batch(given, &b);
  EXPECT_EQ(back.same_as_first, masks);
  const std::vector<uint32_t> wrong_count(2, 0);
  EXPECT_THROW(encode_batch(cases, nullptr, &wrong_count), std::logic_error);
}

WorkerSpec spec(const std::string& backend) {
  WorkerSpec s;
  s.exe = mlafuzz::build_paths::kMlafuzz;
  s.backend = backend;
  return s;
}

// The test worker (tests/harness/test_worker.cc): `mlafuzz worker` with the test hooks.
WorkerSpec test_worker_spec(const std::string& backend) {
  WorkerSpec s = spec(backend);
  s.exe = mlafuzz::build_paths::kTestWorker;
  return s;
}

// Sets MLAFUZZ_TEST_FAULT for test workers started while it lives.
struct FaultEnv {
  explicit FaultEnv(const char* v) { ::setenv("MLAFUZZ_TEST_FAULT", v, 1); }
  ~FaultEnv() { ::unsetenv("MLAFUZZ_TEST_FAULT"); }
};

TEST(Worker, ProxyGivesTheInProcessBits) {
  const MaterializedCase m = small_case(2);
  auto slot = std::make_shared<WorkerSlot>(spec("cpu-simt"));
  ProxyBackend proxy(slot, 60);
  EXPECT_EQ(proxy.traits().name, "cpu-simt");
  EXPECT_EQ(proxy.traits().precision, Precision::kSimtFp32);
  EXPECT_FALSE(proxy.traits().on_device);
  const RunResult a = proxy.run(m);
  const RunResult b = make_backend("cpu-simt")->run(m);
  ASSERT_EQ(a.status, RunStatus::kOk) << a.message;
  EXPECT_EQ(a.out_raw, b.out_raw);
  EXPECT_EQ(a.lse_raw.size(), b.lse_raw.size());
  EXPECT_EQ(0, std::memcmp(a.lse_raw.data(), b.lse_raw.data(), a.lse_raw.size() * 4));
  // The worker sent raw outputs only (protocol 2); the proxy widened them as in-process.
  EXPECT_FALSE(a.outputs_pending);
  ASSERT_EQ(a.out.size(), b.out.size());
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * 8));
  ASSERT_EQ(a.lse.size(), b.lse.size());
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 8));
  EXPECT_EQ(a.guard_violations, 0);
  EXPECT_FALSE(proxy.unsupported(m).has_value());
  EXPECT_TRUE(proxy.take_faults().empty());
}

void expect_fault_then_recovery(const char* hook, const std::string& needle, double timeout) {
  const MaterializedCase big = small_case(4), small = small_case(1);
  std::shared_ptr<WorkerSlot> slot;
  {
    FaultEnv env(hook);  // the worker inherits it; faults on cases with >= 2 heads
    slot = std::make_shared<WorkerSlot>(test_worker_spec("cpu-simt"));
    slot->proc.info();
  }
  ProxyBackend proxy(slot, timeout);
  const RunResult ok = proxy.run(small);
  EXPECT_EQ(ok.status, RunStatus::kOk) << ok.message;
  const RunResult f = proxy.run(big);
  EXPECT_EQ(f.status, RunStatus::kFault);
  EXPECT_NE(f.message.find(needle), std::string::npos) << f.message;
  const auto faults = proxy.take_faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].backend, "cpu-simt");
  // The next call runs on a fresh worker (started without the hook now).
  const RunResult again = proxy.run(big);
  EXPECT_EQ(again.status, RunStatus::kOk) << again.message;
  EXPECT_EQ(slot->proc.starts(), 2);
  EXPECT_EQ(slot->faults, 1);
}

TEST(Worker, CrashBecomesFault) { expect_fault_then_recovery("crash:2", "signal 11", 60); }
TEST(Worker, AbortBecomesFault) { expect_fault_then_recovery("abort:2", "signal 6", 60); }
TEST(Worker, HangBecomesFault) { expect_fault_then_recovery("hang:2", "hang", 1.0); }
TEST(Worker, StickyDeviceErrorBecomesFault) {
  expect_fault_then_recovery("sticky:2", "illegal memory access", 60);
}

// `cases` through one batch request to the worker of `slot`: the same bits as the in-process
// backend run case by case, one round trip for all of them.
void expect_batch_gives_the_calls_one_by_one(std::shared_ptr<WorkerSlot> slot,
                                             const std::vector<const MaterializedCase*>& cases) {
  ProxyBackend proxy(slot, 60);
  const std::vector<CheckedRun> got = proxy.run_batch(cases);
  ASSERT_EQ(got.size(), cases.size());
  const auto local = make_backend("cpu-mma");
  for (size_t k = 0; k < cases.size(); ++k) {
    ASSERT_FALSE(got[k].unsupported.has_value()) << k;
    const RunResult want = local->run(*cases[k]);
    ASSERT_EQ(got[k].result.status, RunStatus::kOk) << k << ": " << got[k].result.message;
    EXPECT_EQ(got[k].result.out_raw, want.out_raw) << k;
    ASSERT_EQ(got[k].result.lse_raw.size(), want.lse_raw.size()) << k;
    EXPECT_EQ(
        0, std::memcmp(got[k].result.lse_raw.data(), want.lse_raw.data(), want.lse_raw.size() * 4))
        << k;
    EXPECT_EQ(got[k].result.out, want.out) << k;
    EXPECT_EQ(got[k].result.guard_violations, want.guard_violations) << k;
  }
  EXPECT_EQ(proxy.totals()->get().first, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(proxy.totals()->requests(), 1);
  EXPECT_EQ(slot->proc.starts(), 1);
}

// The property variants of a case in one request.
TEST(Worker, BatchGivesTheCallsOneByOne) {
  const MaterializedCase m = small_case(3);
  const MaterializedCase poisoned = poison_case(m, 1), alone = head_alone(m, 2),
                         relocated = relocate_pages(m, 3), permuted = permute_indices(m, 4);
  expect_batch_gives_the_calls_one_by_one(std::make_shared<WorkerSlot>(spec("cpu-mma")),
                                          {&m, &m, &poisoned, &relocated, &alone, &permuted});
}

// A fault inside a batch costs that case only: the cases before it keep their results, the
// cases after it run on a fresh worker.
void expect_batch_fault_isolated(const char* hook, const std::string& needle, double timeout) {
  const MaterializedCase big = small_case(4), small = small_case(1);
  std::shared_ptr<WorkerSlot> slot;
  {
    FaultEnv env(hook);  // this worker faults on cases with >= 2 heads; fresh ones do not
    slot = std::make_shared<WorkerSlot>(test_worker_spec("cpu-simt"));
    slot->proc.info();
  }
  ProxyBackend proxy(slot, timeout);
  const std::vector<CheckedRun> got = proxy.run_batch({&small, &big, &big, &small});
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].result.status, RunStatus::kOk) << got[0].result.message;
  EXPECT_EQ(got[1].result.status, RunStatus::kFault);
  EXPECT_NE(got[1].result.message.find(needle), std::string::npos) << got[1].result.message;
  EXPECT_EQ(got[2].result.status, RunStatus::kOk) << got[2].result.message;
  EXPECT_EQ(got[3].result.status, RunStatus::kOk) << got[3].result.message;
  const auto want = make_backend("cpu-simt")->run(big);
  EXPECT_EQ(got[2].result.out_raw, want.out_raw);
  const auto faults = proxy.take_faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(slot->proc.starts(), 2);
  EXPECT_EQ(slot->faults, 1);
}

// The overlapped batch loop (a PipelinedBackend, as the CUDA backends: case k begun before case
// k-1 is finished), through the test worker's MLAFUZZ_TEST_OVERLAP=1.
struct OverlapEnv {
  OverlapEnv() { ::setenv("MLAFUZZ_TEST_OVERLAP", "1", 1); }
  ~OverlapEnv() { ::unsetenv("MLAFUZZ_TEST_OVERLAP"); }
};

TEST(Worker, OverlappedBatchGivesTheCallsOneByOne) {
  const MaterializedCase m = small_case(3), other = small_case(2);
  const MaterializedCase poisoned = poison_case(m, 1), alone = head_alone(m, 2),
                         relocated = relocate_pages(m, 3), permuted = permute_indices(m, 4);
  std::shared_ptr<WorkerSlot> slot;
  {
    OverlapEnv env;
    slot = std::make_shared<WorkerSlot>(test_worker_spec("cpu-mma"));
    slot->proc.info();
  }
  // Lent vectors (the repeats of m) and cases of other shapes, in order.
  expect_batch_gives_the_calls_one_by_one(
      slot, {&m, &m, &poisoned, &relocated, &alone, &permuted, &other, &m});
}

TEST(Worker, CrashInAnOverlappedBatchCostsOneCase) {
  OverlapEnv env;
  expect_batch_fault_isolated("crash:2", "signal 11", 60);
}
TEST(Worker, HangInAnOverlappedBatchCostsOneCase) {
  OverlapEnv env;
  expect_batch_fault_isolated("hang:2", "hang", 1.0);
}
TEST(Worker, StickyErrorInAnOverlappedBatchCostsOneCase) {
  OverlapEnv env;
  expect_batch_fault_isolated("sticky:2", "illegal memory access", 60);
}

// A python: kernel in a campaign is wrapped (SelfIsolatedBackend): the wrapper must describe
// it as the kernel does, or its invariance claims and extra pipeline would be ignored there.
class DescribedBackend final : public TraitsBackend<Backend> {
 public:
  DescribedBackend() {
    traits_.name = "described";
    traits_.precision = Precision::kSimtFp32;
    traits_.envelope.heads.max = 7;
    traits_.envelope.refuses = kFeatureExtraCache;
    traits_.inexact_invariants = kInvariantBatch | kInvariantHead;
    traits_.extra_pipeline = ExtraPipeline::kLseMerged;
    traits_.abs_tol = 0.25;
    traits_.splits_kv = true;
    traits_.token_tile = 32;
    traits_.simt_partner = "partner";
  }

 protected:
  RunResult run_case(const MaterializedCase&) override { return {}; }
};

TEST(Isolation, SelfIsolatedBackendDescribesItselfAsTheKernel) {
  const SelfIsolatedBackend w(std::make_unique<DescribedBackend>());
  const DescribedBackend d;
  EXPECT_EQ(w.traits().name, d.traits().name);
  EXPECT_EQ(w.traits().inexact_invariants, d.traits().inexact_invariants);
  EXPECT_EQ(w.traits().extra_pipeline, d.traits().extra_pipeline);
  EXPECT_EQ(envelope_to_json(w.traits().envelope).dump(),
            envelope_to_json(d.traits().envelope).dump());
  EXPECT_EQ(w.traits().abs_tol, d.traits().abs_tol);
  EXPECT_EQ(w.traits().splits_kv, d.traits().splits_kv);
  EXPECT_EQ(w.traits().token_tile, d.traits().token_tile);
  EXPECT_EQ(w.traits().simt_partner, d.traits().simt_partner);
}

TEST(Worker, CrashInABatchCostsOneCase) { expect_batch_fault_isolated("crash:2", "signal 11", 60); }
TEST(Worker, HangInABatchCostsOneCase) { expect_batch_fault_isolated("hang:2", "hang", 1.0); }
TEST(Worker, StickyErrorInABatchCostsOneCase) {
  expect_batch_fault_isolated("sticky:2", "illegal memory access", 60);
}

// evaluate_case through a worker (every property's variants batched) judges as in-process.
TEST(Worker, EvaluationThroughABatchingWorkerMatchesInProcess) {
  auto slot = std::make_shared<WorkerSlot>(spec("cpu-mma"));
  ProxyBackend proxy(slot, 60);
  const auto local = make_backend("cpu-mma");
  GenConfig cfg;
  int compared = 0;
  for (uint64_t i = 0; compared < 6 && i < 40; ++i) {
    const Case c = generate_case(13, i, cfg, nullptr);
    if (c.batch * c.heads * c.topk > 8192) continue;
    const CaseEvaluation a = evaluate_case(c, {&proxy}, {});
    const CaseEvaluation b = evaluate_case(c, {local.get()}, {});
    ASSERT_EQ(a.outcomes.size(), b.outcomes.size()) << "case " << i;
    for (size_t k = 0; k < a.outcomes.size(); ++k) {
      EXPECT_EQ(a.outcomes[k].property, b.outcomes[k].property) << "case " << i;
      EXPECT_EQ(a.outcomes[k].applicable, b.outcomes[k].applicable) << "case " << i;
      EXPECT_EQ(a.outcomes[k].passed, b.outcomes[k].passed) << "case " << i;
      EXPECT_EQ(a.outcomes[k].detail, b.outcomes[k].detail) << "case " << i;
      EXPECT_EQ(a.outcomes[k].tightness, b.outcomes[k].tightness) << "case " << i;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 6);
  // The clean run and the variants: two requests per case.
  EXPECT_EQ(proxy.totals()->requests(), 2 * compared);
}

// run_batch with raw outputs: the same request, results left pending (guard bands counted);
// widened, the bits of the in-process backend.
TEST(Worker, RawBatchLeavesTheWideningToTheCaller) {
  const MaterializedCase m = small_case(3);
  const MaterializedCase poisoned = poison_case(m, 2), relocated = relocate_pages(m, 5);
  const std::vector<const MaterializedCase*> cases{&m, &poisoned, &relocated};
  auto slot = std::make_shared<WorkerSlot>(spec("cpu-simt"));
  ProxyBackend proxy(slot, 60);
  RunOptions raw;
  raw.raw_outputs = true;
  std::vector<CheckedRun> got = proxy.run_batch(cases, raw);
  ASSERT_EQ(got.size(), cases.size());
  const auto local = make_backend("cpu-simt");
  for (size_t k = 0; k < cases.size(); ++k) {
    RunResult& r = got[k].result;
    ASSERT_EQ(r.status, RunStatus::kOk) << k << ": " << r.message;
    EXPECT_TRUE(r.outputs_pending) << k;
    EXPECT_TRUE(r.out.empty()) << k;
    const RunResult want = local->run(*cases[k]);
    EXPECT_EQ(r.guard_violations, want.guard_violations) << k;
    EXPECT_EQ(r.out_raw, want.out_raw) << k;
    widen_raw_outputs(*cases[k], r);
    EXPECT_EQ(r.out, want.out) << k;
  }
}

// Planted bugs that the bitwise properties catch (reading pad bytes, writing the head pad,
// ignoring the page stride) are judged the same through a worker, whose variants stay raw
// until a property reads values, as in-process (same verdicts, details and figures).
TEST(Worker, LazyWideningJudgesPlantedBugsAsInProcess) {
  GenConfig cfg;
  int failed_bitwise = 0;
  for (const char* mutant : {"cpu-mma~unmasked-pad-columns", "cpu-mma~store-padded-columns",
                             "cpu-mma~page-stride-ignored"}) {
    auto slot = std::make_shared<WorkerSlot>(spec(mutant));
    ProxyBackend proxy(slot, 60);
    const auto local = make_backend(mutant);
    int compared = 0;
    for (uint64_t i = 0; compared < 5 && i < 60; ++i) {
      const Case c = generate_case(17, i, cfg, nullptr);
      if (c.batch * c.heads * c.topk > 8192) continue;
      const CaseEvaluation a = evaluate_case(c, {&proxy}, {});
      const CaseEvaluation b = evaluate_case(c, {local.get()}, {});
      ASSERT_EQ(a.outcomes.size(), b.outcomes.size()) << mutant << " case " << i;
      for (size_t k = 0; k < a.outcomes.size(); ++k) {
        const PropertyOutcome &x = a.outcomes[k], &y = b.outcomes[k];
        EXPECT_EQ(x.property, y.property) << mutant << " case " << i;
        EXPECT_EQ(x.passed, y.passed) << mutant << " case " << i << " " << x.property;
        EXPECT_EQ(x.detail, y.detail) << mutant << " case " << i << " " << x.property;
        EXPECT_EQ(x.tightness, y.tightness) << mutant << " case " << i << " " << x.property;
        const bool bitwise =
            x.property == "poison" || x.property == "relocate" || x.property == "determinism";
        failed_bitwise += bitwise && x.applicable && !x.passed;
      }
      ++compared;
    }
    EXPECT_EQ(compared, 5) << mutant;
  }
  EXPECT_GT(failed_bitwise, 0) << "no planted bug failed poison, relocate or determinism: the "
                                  "test would not see a raw comparison that misses a difference";
}

TEST(Worker, UnknownBackendIsAClearError) {
  WorkerProcess w(spec("no-such-backend"));
  try {
    w.info();
    ADD_FAILURE() << "a worker served an unknown backend";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-backend"), std::string::npos) << e.what();
  }
}

TEST(Worker, MutantNamesResolveInWorkers) {
  auto slot = std::make_shared<WorkerSlot>(spec("cpu-mma~unmasked-pad-columns"));
  ProxyBackend proxy(slot, 60);
  EXPECT_EQ(proxy.traits().name, "cpu-mma~unmasked-pad-columns");
}

TEST(Worker, DeviceInfoAnswers) {
  const auto text =
      ipc::run_capture({mlafuzz::build_paths::kMlafuzz, "worker", "--device-info"}, 60);
  ASSERT_TRUE(text.has_value());
  // The parent reads the child's answer through the same field table the child wrote it with.
  const DeviceInfo d = device_info_from_json(*text);
  EXPECT_EQ(device_info_to_json(d), *text);
  EXPECT_EQ(static_cast<size_t>(d.count), d.names.size());
  try {
    device_info_from_json(R"({"count": "two", "names": [], "driver": "", "runtime": "",)"
                          R"( "error": ""})");
    ADD_FAILURE() << "a non-integer count was read";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "device query.count: expected an integer");
  }
}

// A campaign tells the Python device workers it starts how many of them share the GPU
// (MLAFUZZ_DEVICE_WORKERS), so that their device caches together keep a bounded part of its
// memory: 32 workers of 4 GiB each would exhaust an H200's memory. The kernel below
// reports the variable it sees through its exception (a kError result carries the traceback).
TEST(PythonWorkers, WorkersStartedAfterTheCountIsSetAreToldIt) {
  const char* python = std::getenv("MLAFUZZ_PYTHON");
  const std::string interpreter = python != nullptr && *python ? python : "python3";
  if (std::system((interpreter + " -c 'import numpy' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << interpreter << " cannot import numpy (set MLAFUZZ_PYTHON)";
  }
  unsetenv("MLAFUZZ_DEVICE_WORKERS");
  const std::string dir = ::testing::TempDir() + "mlafuzz_device_workers";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const std::string file = dir + "/env_kernel.py";
  {
    FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(
        "import os\nimport mlafuzz\n\n\n@mlafuzz.kernel(name=\"env\", precision=\"fp32_simt\")\n"
        "def decode(call):\n    raise RuntimeError(\"workers=\" + "
        "os.environ.get(\"MLAFUZZ_DEVICE_WORKERS\", \"unset\"))\n",
        f);
    std::fclose(f);
  }
  const MaterializedCase m = small_case(2);
  const auto message_of = [&] {
    const auto b = make_python_backend("python:" + file + ":decode");
    const RunResult r = b->run(m);
    EXPECT_EQ(r.status, RunStatus::kError);
    return r.message;
  };
  EXPECT_NE(message_of().find("workers=unset"), std::string::npos);
  set_python_device_workers(7);
  EXPECT_NE(message_of().find("workers=7"), std::string::npos);
  setenv("MLAFUZZ_DEVICE_WORKERS", "3", 1);  // the user's value is kept
  EXPECT_NE(message_of().find("workers=3"), std::string::npos);
  unsetenv("MLAFUZZ_DEVICE_WORKERS");
  set_python_device_workers(0);
  EXPECT_NE(message_of().find("workers=unset"), std::string::npos);
}

}  // namespace
}  // namespace mlafuzz::campaign
