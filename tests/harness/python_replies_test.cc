// The Python worker's INFO reply read through its field table (harness/backends/python_replies.h):
// the replies the package sends today, older replies without the optional fields, fields a
// newer package adds, and malformed replies, each refused naming the field.
#include "harness/backends/python_replies.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/core/build_paths.h"

namespace mlafuzz {
namespace {

using fields::Json;

constexpr const char* kRepro =
    "\n  reproduce: ctest --test-dir build -R 'Python(Info|Replies)' --output-on-failure";

// What python/mlafuzz/worker/server.py's info_reply() sends for a kernel with every declaration
// (tests/python/envelope_kernels.py style), key for key in its order.
Json full_reply() {
  return Json::parse(R"({
    "protocol": 3, "name": "tiled", "description": "a tiled kernel", "precision": "custom",
    "abs_tol": 0.002, "rel_tol": 0.01, "device": "cuda", "has_supports": true,
    "available": false, "reason": "device='cuda' but torch sees no CUDA device", "pid": 4242,
    "python": "/usr/bin/python3", "python_version": "3.11.2", "numpy": "1.24.2",
    "envelope": {"format": "mlafuzz-envelope", "version": 1, "batch": {"values": [1, 2]}},
    "inexact": ["batch", "page_placement"], "extra_pipeline": "lse_merged", "token_tile": 8,
    "extra_cache": true,
    "mutants": {"zeta-first": "declared first", "alpha-second": "declared second"}
  })");
}

PythonInfo read(const Json& j) { return read_python_info(j, "python:k.py:decode", "/bin/py"); }

// The message read_python_info throws for `j` ("" when it reads).
std::string error_of(const Json& j) {
  try {
    read(j);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(PythonInfo, EveryFieldTheCurrentPackageSendsIsRead) {
  const PythonInfo info = read(full_reply());
  const PythonDescription& d = info.description;
  EXPECT_EQ(info.protocol, 3) << kRepro;
  EXPECT_EQ(info.pid, 4242) << kRepro;
  EXPECT_EQ(d.name, "tiled") << kRepro;
  EXPECT_EQ(d.description, "a tiled kernel") << kRepro;
  EXPECT_EQ(d.device, "cuda") << kRepro;
  EXPECT_TRUE(d.has_supports) << kRepro;
  EXPECT_EQ(d.python, "/usr/bin/python3") << kRepro;
  EXPECT_EQ(d.python_version, "3.11.2") << kRepro;
  EXPECT_EQ(d.numpy_version, "1.24.2") << kRepro;
  EXPECT_TRUE(d.has_envelope) << kRepro;
  EXPECT_TRUE(d.declares_extra_cache) << kRepro;
  ASSERT_EQ(d.mutants.size(), 2u) << kRepro;
  EXPECT_EQ(d.mutants[0], std::make_pair(std::string("zeta-first"), std::string("declared first")))
      << "mutants keep the reply's order" << kRepro;
  EXPECT_EQ(d.mutants[1].first, "alpha-second") << kRepro;

  const BackendTraits& t = d.traits;
  EXPECT_EQ(t.name, "python:k.py:decode") << kRepro;
  EXPECT_EQ(t.precision, Precision::kCustom) << kRepro;
  EXPECT_EQ(t.abs_tol, 0.002) << kRepro;
  EXPECT_EQ(t.rel_tol, 0.01) << kRepro;
  EXPECT_TRUE(t.on_device) << kRepro;
  EXPECT_TRUE(t.needs_worker) << kRepro;
  EXPECT_FALSE(t.availability.available) << kRepro;
  EXPECT_EQ(t.availability.reason, "device='cuda' but torch sees no CUDA device") << kRepro;
  EXPECT_EQ(t.envelope, envelope_from_json(full_reply()["envelope"])) << kRepro;
  EXPECT_EQ(t.inexact_invariants, kInvariantBatch | kInvariantPagePlacement) << kRepro;
  EXPECT_EQ(t.extra_pipeline, ExtraPipeline::kLseMerged) << kRepro;
  EXPECT_EQ(t.token_tile, 8) << kRepro;
}

TEST(PythonInfo, TheDefaultsOfAKernelThatDeclaresNothing) {
  // What the package sends for @mlafuzz.kernel(name="plain") on the CPU.
  const Json j = Json::parse(R"({
    "protocol": 3, "name": "plain", "description": "", "precision": "bf16_mma", "abs_tol": 0.0,
    "rel_tol": 0.0, "device": "cpu", "has_supports": false, "available": true, "reason": "",
    "pid": 7, "python": "/usr/bin/python3", "python_version": "3.11.2", "numpy": "1.24.2",
    "envelope": null, "inexact": [], "extra_pipeline": "joint", "token_tile": 0,
    "extra_cache": null, "mutants": {}
  })");
  const PythonDescription d = read(j).description;
  EXPECT_EQ(d.traits.precision, Precision::kMmaBf16) << kRepro;
  EXPECT_FALSE(d.traits.on_device) << kRepro;
  EXPECT_TRUE(d.traits.availability.available) << kRepro;
  EXPECT_FALSE(d.has_envelope) << kRepro;
  EXPECT_EQ(d.traits.envelope, Envelope{}) << kRepro;
  EXPECT_EQ(d.traits.inexact_invariants, 0u) << kRepro;
  EXPECT_EQ(d.traits.extra_pipeline, ExtraPipeline::kJoint) << kRepro;
  EXPECT_EQ(d.traits.token_tile, 0) << kRepro;
  EXPECT_FALSE(d.declares_extra_cache) << kRepro;
  EXPECT_TRUE(d.mutants.empty()) << kRepro;

  Json said_false = j;
  said_false["extra_cache"] = false;
  EXPECT_FALSE(read(said_false).description.declares_extra_cache) << kRepro;
}

TEST(PythonInfo, AnOlderReplyWithoutTheOptionalFieldsMeansAcceptsAnything) {
  const PythonInfo info =
      read(Json::parse(R"({"protocol": 3, "name": "old", "precision": "fp32_simt"})"));
  const PythonDescription& d = info.description;
  EXPECT_EQ(d.traits.precision, Precision::kSimtFp32) << kRepro;
  EXPECT_EQ(d.device, "cpu") << kRepro;
  EXPECT_FALSE(d.traits.on_device) << kRepro;
  EXPECT_TRUE(d.traits.availability.available) << kRepro;
  EXPECT_EQ(d.python, "/bin/py") << "the interpreter mlafuzz started" << kRepro;
  EXPECT_FALSE(d.has_envelope) << kRepro;
  EXPECT_EQ(d.traits.inexact_invariants, 0u) << kRepro;
  EXPECT_EQ(d.traits.token_tile, 0) << kRepro;
  EXPECT_EQ(d.traits.extra_pipeline, ExtraPipeline::kJoint) << kRepro;
  EXPECT_TRUE(d.mutants.empty()) << kRepro;
}

TEST(PythonInfo, AFieldANewerPackageAddsIsIgnored) {
  Json j = full_reply();
  j["a_field_of_a_later_package"] = {{"anything", 1}};
  const PythonInfo with = read(j);
  const PythonInfo without = read(full_reply());
  EXPECT_EQ(with.description.traits, without.description.traits) << kRepro;
  EXPECT_EQ(with.description.mutants, without.description.mutants) << kRepro;
}

TEST(PythonInfo, AMalformedFieldIsRefusedNamingIt) {
  struct Bad {
    const char* key;
    Json value;
    const char* expected;  // part of the message
  };
  const Bad bad[] = {
      {"precision", "fp16",
       "info.precision: unknown value 'fp16' (known: bf16_mma, fp32_simt, "
       "custom)"},
      {"precision", 3, "info.precision: expected a string"},
      {"name", nullptr, "info.name: expected a string"},
      {"abs_tol", "small", "info.abs_tol: expected a number"},
      {"device", "rocm", "info.device: unknown value 'rocm' (known: cpu, cuda)"},
      {"has_supports", "yes", "info.has_supports: expected true or false"},
      {"available", 1, "info.available: expected true or false"},
      {"reason", false, "info.reason: expected a string"},
      {"envelope", Json::parse(R"({"batch": "many"})"), "info.envelope"},
      {"inexact", Json::parse(R"(["batch", "batches"])"),
       "info.inexact: unknown invariant "
       "'batches'"},
      {"inexact", "batch", "info.inexact: expected an array"},
      {"extra_pipeline", "merged",
       "info.extra_pipeline: unknown value 'merged' (known: joint, "
       "lse_merged)"},
      {"token_tile", -1, "info.token_tile: expected a number of tokens"},
      {"token_tile", 1 << 21, "info.token_tile: expected a number of tokens"},
      {"token_tile", 8.5, "info.token_tile: expected a number of tokens"},
      {"extra_cache", "true", "info.extra_cache: expected true, false or null"},
      {"mutants", Json::parse(R"(["a"])"), "info.mutants: expected an object or null"},
      {"mutants", Json::parse(R"({"off-by-one": 3})"),
       "info.mutants.off-by-one: expected a "
       "string"},
      {"pid", "self", "info.pid: expected an integer"},
  };
  for (const Bad& b : bad) {
    Json j = full_reply();
    j[b.key] = b.value;
    const std::string message = error_of(j);
    EXPECT_NE(message.find(b.expected), std::string::npos)
        << b.key << " = " << b.value.dump() << " gave: " << message << kRepro;
  }
}

TEST(PythonInfo, AMissingRequiredFieldIsRefusedNamingIt) {
  for (const char* key : {"protocol", "name", "precision"}) {
    Json j = full_reply();
    j.erase(key);
    EXPECT_EQ(error_of(j), std::string("info.") + key + ": missing") << kRepro;
  }
  EXPECT_EQ(error_of(Json::array()), "info: expected an object") << kRepro;
}

TEST(PythonInfo, WhatTheTableWritesReadsBackTheSame) {
  const PythonInfo info = read(full_reply());
  const Json written = fields::write(info, python_info_fields());
  const PythonInfo again = read(written);
  EXPECT_EQ(again.description.traits, info.description.traits) << written.dump() << kRepro;
  EXPECT_EQ(again.description.mutants, info.description.mutants) << kRepro;
  EXPECT_EQ(again.description.declares_extra_cache, true) << kRepro;
  EXPECT_EQ(again.description.python, info.description.python) << kRepro;
}

// The fields of the INFO reply listed in docs/WORKER_PROTOCOL.md's frame table, in order (the
// python test test_protocol.py checks that the package sends exactly these).
std::vector<std::string> documented_info_keys() {
  std::ifstream doc(std::string(mlafuzz::build_paths::kSourceDir) + "/docs/WORKER_PROTOCOL.md");
  std::string line;
  while (std::getline(doc, line) && line.rfind("| 1 INFO |", 0) != 0) {
  }
  const size_t reply = line.find("INFO:");
  std::vector<std::string> keys;
  if (reply == std::string::npos) return keys;
  const std::regex key("`([a-z_]+)`");
  const std::string text = line.substr(reply);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), key); it != std::sregex_iterator();
       ++it) {
    const std::string k = (*it)[1];
    if (k != "bf16_mma" && k != "fp32_simt" && k != "custom" && k != "cpu" && k != "cuda") {
      keys.push_back(k);
    }
  }
  return keys;
}

TEST(PythonInfo, TheTableReadsEveryDocumentedFieldInOrder) {
  std::vector<std::string> keys, sent;
  for (const auto& f : python_info_fields()) keys.push_back(f.key);
  EXPECT_EQ(keys, documented_info_keys()) << kRepro;
  const Json reply = full_reply();
  for (const auto& [k, v] : reply.items()) sent.push_back(k);
  EXPECT_EQ(sent, keys) << "full_reply() is what the package sends" << kRepro;
}

// The message `read` throws for `j` ("" when it reads).
template <class Read>
std::string reply_error(Read read, const char* text) {
  try {
    read(Json::parse(text));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(PythonReplies, SupportsRepliesTheCurrentPackageSends) {
  EXPECT_FALSE(read_python_supports_reply(Json::parse(R"({"reason": null})")).reason) << kRepro;
  EXPECT_EQ(read_python_supports_reply(Json::parse(R"({"reason": "s_q > 1"})")).reason, "s_q > 1")
      << kRepro;
  const PythonSupportsReply raised =
      read_python_supports_reply(Json::parse(R"({"reason": null, "error": "Traceback ..."})"));
  EXPECT_FALSE(raised.reason) << kRepro;
  EXPECT_EQ(raised.error, "Traceback ...") << kRepro;
  EXPECT_EQ(reply_error(read_python_supports_reply, R"({"reason": 3})"),
            "supports.reason: expected a string")
      << kRepro;
  EXPECT_EQ(reply_error(read_python_supports_reply, R"({})"), "supports.reason: missing") << kRepro;
}

TEST(PythonReplies, RunRepliesTheCurrentPackageSends) {
  using S = PythonRunReply::Status;
  const PythonRunReply ok =
      read_python_run_reply(Json::parse(R"({"status": "ok", "message": "", "seconds": 0.000125})"));
  EXPECT_EQ(ok.status, S::kOk) << kRepro;
  EXPECT_EQ(ok.seconds, 0.000125) << kRepro;
  const PythonRunReply raised = read_python_run_reply(
      Json::parse(R"({"status": "error", "seconds": 0.5, "message": "Traceback ..."})"));
  EXPECT_EQ(raised.status, S::kError) << kRepro;
  EXPECT_EQ(raised.message, "Traceback ...") << kRepro;
  EXPECT_EQ(read_python_run_reply(Json::parse(R"({"status": "fault", "message": "x"})")).status,
            S::kFault)
      << kRepro;
  EXPECT_EQ(reply_error(read_python_run_reply, R"({"status": "done"})"),
            "run.status: unknown value 'done' (known: ok, error, fault)")
      << kRepro;
  EXPECT_EQ(reply_error(read_python_run_reply, R"({"status": "ok", "seconds": "1"})"),
            "run.seconds: expected a number (or \"inf\", \"-inf\", \"nan\")")
      << kRepro;
  EXPECT_EQ(reply_error(read_python_run_reply, R"({"message": "x"})"), "run.status: missing")
      << kRepro;
}

}  // namespace
}  // namespace mlafuzz
