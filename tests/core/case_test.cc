// Case JSON: round trips, strictness, validation errors naming their field, atomic saving.
#include "core/case.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "tests/core/test_util.h"

namespace mlafuzz {
namespace {

using testing::small_case;
using testing::TempDir;
using json = nlohmann::ordered_json;

// A case that sets every field to a non-default value, so a field the writer forgets or the
// reader ignores breaks the round trip.
Case everything_case() {
  Case c;
  c.name = "everything";
  c.description = "all fields set";
  c.geom.layout = mla::Layout::kV32;
  c.geom.nope_dim = 256;
  c.geom.rope_dim = 32;
  c.geom.scale_tile = 128;
  c.geom.page_size = 61;
  c.geom.page_stride = 61 * 400 + 17;
  c.geom.num_pages = 3;
  c.page_order = {2, 0, 1};
  c.batch = 2;
  c.heads = 4;
  c.topk = 3;
  c.indices = {{0, -1, 182}, {5, 5, -1}};
  c.index_spec = {IndexRule::kPageRuns, 0.25, 0.5};
  c.topk_length = std::vector<int32_t>{3, 0};
  c.sink = std::vector<double>{std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(), 0.5, -1.25};
  c.sm_scale = 0.0625;
  c.conventions = {mla::InvalidIndexRule::kAnyNegative, mla::EmptyRowLse::kNegInf, true};
  c.q_head_pad = 3;
  c.out_head_pad = 5;
  c.q_values = {ValueDist::kUniform, 2.5, 0.125};
  c.kv_values = {ValueDist::kSmallInt, 0.5, 0.0};
  c.rope_values = {ValueDist::kTies, 3.0, 1.0};
  c.scales = {ScaleMode::kRandom, 100, 140};
  c.pad_fill = Fill::kGarbage;
  c.data_seed = 18446744073709551615ull;  // 2^64 - 1: the full seed range survives JSON
  c.q_source = Case::QSource{7, {5, 0}, {6, 6, 1, 0}, 1, {}};
  return c;
}

void expect_same(const Case& a, const Case& b) { EXPECT_EQ(to_json(a), to_json(b)); }

// The layout json_to_text promises, written the plain way: every key and scalar exactly as
// nlohmann's dump() writes it, arrays of scalars on one line, objects and other arrays one entry
// per line indented by two.
void reference_text(const json& j, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  const auto flat = [](const json& a) {
    for (const auto& e : a) {
      if (e.is_array() || e.is_object()) return false;
    }
    return true;
  };
  if (j.is_object() && !j.empty()) {
    out += "{\n";
    size_t i = 0;
    for (const auto& [key, value] : j.items()) {
      out += pad + json(key).dump() + ": ";
      reference_text(value, indent + 2, out);
      out += ++i < j.size() ? ",\n" : "\n";
    }
    out += std::string(static_cast<size_t>(indent), ' ') + "}";
  } else if (j.is_array() && !j.empty() && !flat(j)) {
    out += "[\n";
    for (size_t i = 0; i < j.size(); ++i) {
      out += pad;
      reference_text(j[i], indent + 2, out);
      out += i + 1 < j.size() ? ",\n" : "\n";
    }
    out += std::string(static_cast<size_t>(indent), ' ') + "]";
  } else if (j.is_array()) {
    out += "[";
    for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + j[i].dump();
    out += "]";
  } else {
    out += j.dump();
  }
}

TEST(CaseJson, TextWritesEveryKeyAndScalarAsDumpDoes) {
  json j = case_to_json_value(everything_case());
  // What a case file does not hold but a corpus entry or a report may: keys and strings that
  // need escaping, the integer extremes, doubles, non-finite doubles, nesting of every kind.
  j["odd \"key\"\t\u00e9"] = "line\nbreak \"quoted\" \\ \u00e9";
  j["integers"] = {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                   std::numeric_limits<uint64_t>::max()};
  j["doubles"] = {0.1, -0.0, 1e300, std::numeric_limits<double>::quiet_NaN(),
                  -std::numeric_limits<double>::infinity()};
  j["nested"] = {json::array(), json::object(), {{"a", {1, {2, 3}}}}, json(nullptr), true};
  std::string want;
  reference_text(j, 0, want);
  EXPECT_EQ(json_to_text(j), want + "\n");
}

TEST(CaseJson, RoundTripKeepsEveryField) {
  const Case c = everything_case();
  const std::string text = to_json(c);
  const Case back = case_from_json(text);
  EXPECT_EQ(to_json(back), text);
  EXPECT_EQ(back.geom.layout, mla::Layout::kV32);
  EXPECT_EQ(back.geom.page_stride, c.geom.page_stride);
  EXPECT_EQ(back.page_order, c.page_order);
  EXPECT_EQ(back.indices, c.indices);
  EXPECT_EQ(back.index_spec.rule, IndexRule::kPageRuns);
  EXPECT_EQ(*back.topk_length, *c.topk_length);
  EXPECT_TRUE(std::isinf((*back.sink)[0]) && (*back.sink)[0] > 0);
  EXPECT_TRUE(std::isinf((*back.sink)[1]) && (*back.sink)[1] < 0);
  EXPECT_EQ((*back.sink)[3], -1.25);
  EXPECT_EQ(*back.sm_scale, 0.0625);
  EXPECT_EQ(back.conventions.invalid_index, mla::InvalidIndexRule::kAnyNegative);
  EXPECT_EQ(back.conventions.empty_lse, mla::EmptyRowLse::kNegInf);
  EXPECT_TRUE(back.conventions.sink_in_lse);
  EXPECT_EQ(back.q_values.dist, ValueDist::kUniform);
  EXPECT_EQ(back.rope_values.special_fraction, 1.0);
  EXPECT_EQ(back.scales.mode, ScaleMode::kRandom);
  EXPECT_EQ(back.scales.exp_hi, 140);
  EXPECT_EQ(back.pad_fill, Fill::kGarbage);
  EXPECT_EQ(back.data_seed, c.data_seed);
  ASSERT_TRUE(back.q_source.has_value());
  EXPECT_EQ(back.q_source->heads, 7);
  EXPECT_EQ(back.q_source->rows, (std::vector<int32_t>{5, 0}));
  EXPECT_EQ(back.q_source->head_ids, (std::vector<int32_t>{6, 6, 1, 0}));
}

TEST(CaseJson, NonFiniteDoublesAreStrings) {
  const json j = case_to_json_value(everything_case());
  EXPECT_EQ(j["sink"][0], "inf");
  EXPECT_EQ(j["sink"][1], "-inf");
  EXPECT_EQ(j["geometry"]["layout"], "v32");
  EXPECT_EQ(j["conventions"]["empty_lse"], "-inf");
}

TEST(CaseJson, MinimalCaseTakesDefaults) {
  const Case c = case_from_json(R"({"version": 1})");
  expect_same(c, Case{});
  EXPECT_EQ(c.geom.nope_dim, 448);
  EXPECT_DOUBLE_EQ(c.effective_sm_scale(), 1.0 / std::sqrt(512.0));
}

TEST(CaseJson, V32LayoutChangesGeometryDefaults) {
  const Case c = case_from_json(R"({"version": 1, "geometry": {"layout": "v32"}})");
  EXPECT_EQ(c.geom.nope_dim, 512);
  EXPECT_EQ(c.geom.scale_tile, 128);
  EXPECT_EQ(c.d_qk(), 576);
  EXPECT_EQ(c.d_v(), 512);
  EXPECT_DOUBLE_EQ(c.effective_sm_scale(), 1.0 / 24.0);
}

TEST(CaseJson, IndexListsStayOnOneLine) {
  Case c = small_case();
  c.indices = {{0, 1, 2, 3, 4, 5, 6}, {-1, -1, 0, 0, 1, 2, 14}};
  const std::string text = to_json(c);
  EXPECT_NE(text.find("[0, 1, 2, 3, 4, 5, 6]"), std::string::npos) << text;
}

// Each malformed document is rejected with an error naming exactly this field.
struct BadJson {
  const char* json;
  const char* field;
};

class CaseJsonRejects : public ::testing::TestWithParam<BadJson> {};

TEST_P(CaseJsonRejects, NamesTheField) {
  try {
    case_from_json(GetParam().json);
    FAIL() << "accepted: " << GetParam().json;
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), GetParam().field) << e.what();
    EXPECT_FALSE(e.reason().empty());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strictness, CaseJsonRejects,
    ::testing::Values(
        BadJson{R"({"version": 1, "bogus": 3})", "bogus"},
        BadJson{R"({"version": 1, "geometry": {"page_sise": 3}})", "geometry.page_sise"},
        BadJson{R"({"version": 1, "q_values": {"dist": "normal", "mag": 1}})", "q_values.mag"},
        BadJson{R"({"version": 3})", "version"}, BadJson{R"({"batch": 1})", "version"},
        BadJson{R"({"version": 1, "format": "something-else"})", "format"},
        BadJson{R"({"version": 1, "batch": "4"})", "batch"},
        BadJson{R"({"version": 1, "batch": 1.5})", "batch"},
        BadJson{R"({"version": 1, "batch": 4294967296})", "batch"},
        BadJson{R"({"version": 1, "geometry": {"layout": "MODEL1"}})", "geometry.layout"},
        BadJson{R"({"version": 1, "pad_fill": "ones"})", "pad_fill"},
        BadJson{R"({"version": 1, "conventions": {"empty_lse": "inf"}})", "conventions.empty_lse"},
        BadJson{R"({"version": 1, "heads": 2, "sink": [0, "infinity"]})", "sink[1]"},
        BadJson{R"({"version": 1, "data_seed": -1})", "data_seed"},
        BadJson{R"({"version": 1, "indices": [[0], 3]})", "indices[1]"},
        BadJson{R"({"version": 1, "index_spec": 3})", "index_spec"},
        BadJson{R"({"version": 1, "scales": {"convention": "e8m0"}})", "scales.convention"},
        BadJson{R"({"version": 1, "s_q": 2})", "s_q"},
        BadJson{R"({"version": 1, "extra": {}})", "extra"},
        BadJson{R"({"version": 2, "extra": {"geometry": {"pages": 2}}})", "extra.geometry.pages"},
        BadJson{R"({"version": 2, "extra": {"same_values": 1}})", "extra.same_values"},
        BadJson{R"({"version": 2, "q_source": {"rows": [0], "head_ids": [0]}})", "q_source.heads"},
        BadJson{R"({"version": 2, "q_source": {"heads": 1, "rows": [0], "head_ids": [0], "t": 0}})",
                "q_source.t"},
        BadJson{R"([1, 2])", "(top level)"}, BadJson{R"({"version": 1,)", "(json)"},
        BadJson{R"({"format": "mlafuzz-corpus", "version": 1, "case": {"version": 1, "x": 0}})",
                "case.x"},
        BadJson{R"({"format": "mlafuzz-corpus", "version": 7, "case": {"version": 1}})", "version"},
        BadJson{R"({"format": "mlafuzz-corpus", "version": 1,
                    "case": {"version": 1, "topk": 2, "indices": [[0, 99999]]}})",
                "case.indices[0][1]"}));

// Each inconsistent recipe fails validation naming this field.
struct BadCase {
  const char* name;
  std::function<void(Case&)> mutate;
  const char* field;
};

class CaseValidation : public ::testing::TestWithParam<BadCase> {};

TEST_P(CaseValidation, NamesTheField) {
  Case c = small_case();
  c.indices = {{0, 1, 2, 3, 4, 5, 6}, {14, 13, -1, 0, 0, 1, 2}};
  validate(c);  // the base case is valid
  GetParam().mutate(c);
  try {
    validate(c);
    FAIL() << "accepted";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), GetParam().field) << e.what();
  }
  // Loading the same recipe from JSON names the same field.
  try {
    case_from_json(to_json(c));
    FAIL() << "accepted from JSON";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), GetParam().field) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fields, CaseValidation,
    ::testing::Values(
        BadCase{"NopeNotTileMultiple", [](Case& c) { c.geom.nope_dim = 100; },
                "geometry.nope_dim"},
        BadCase{"NopeZero", [](Case& c) { c.geom.nope_dim = 0; }, "geometry.nope_dim"},
        BadCase{"RopeNegative", [](Case& c) { c.geom.rope_dim = -2; }, "geometry.rope_dim"},
        BadCase{"TileZero", [](Case& c) { c.geom.scale_tile = 0; }, "geometry.scale_tile"},
        BadCase{"PageSizeZero", [](Case& c) { c.geom.page_size = 0; }, "geometry.page_size"},
        BadCase{"NoPages", [](Case& c) { c.geom.num_pages = 0; }, "geometry.num_pages"},
        BadCase{"StrideTooSmall", [](Case& c) { c.geom.page_stride = 5 * 584 - 1; },
                "geometry.page_stride"},
        BadCase{"CacheTooLarge", [](Case& c) { c.geom.num_pages = 2000000; },
                "geometry.num_pages"},
        BadCase{"PageOrderLength", [](Case& c) { c.page_order = {0, 1}; },
                "geometry.page_order"},
        BadCase{"PageOrderRange", [](Case& c) { c.page_order = {0, 3, 1}; },
                "geometry.page_order[1]"},
        BadCase{"PageOrderRepeat", [](Case& c) { c.page_order = {1, 0, 1}; },
                "geometry.page_order[2]"},
        BadCase{"BatchZero", [](Case& c) { c.batch = 0; }, "batch"},
        BadCase{"HeadsZero", [](Case& c) { c.heads = 0; }, "heads"},
        BadCase{"TopkZero", [](Case& c) { c.topk = 0; }, "topk"},
        BadCase{"IndexRows", [](Case& c) { c.indices.pop_back(); }, "indices"},
        BadCase{"IndexRowLength", [](Case& c) { c.indices[1].push_back(0); }, "indices[1]"},
        BadCase{"IndexOutOfRange", [](Case& c) { c.indices[1][5] = 15; }, "indices[1][5]"},
        BadCase{"OtherNegativeUnderFlashMla", [](Case& c) { c.indices[0][3] = -2; },
                "indices[0][3]"},
        BadCase{"InvalidFraction", [](Case& c) { c.index_spec.invalid_fraction = 1.5; },
                "index_spec.invalid_fraction"},
        BadCase{"DuplicateFraction", [](Case& c) { c.index_spec.duplicate_fraction = -0.1; },
                "index_spec.duplicate_fraction"},
        BadCase{"TopkLengthCount", [](Case& c) { c.topk_length = std::vector<int32_t>{1}; },
                "topk_length"},
        BadCase{"TopkLengthAbove", [](Case& c) { c.topk_length = std::vector<int32_t>{7, 8}; },
                "topk_length[1]"},
        BadCase{"TopkLengthNegative",
                [](Case& c) { c.topk_length = std::vector<int32_t>{-1, 0}; }, "topk_length[0]"},
        BadCase{"SinkCount", [](Case& c) { c.sink = std::vector<double>{0, 0}; }, "sink"},
        BadCase{"QSourceRows", [](Case& c) { c.q_source = Case::QSource{3, {0}, {0, 1, 2}, 1, {}}; },
                "q_source.rows"},
        BadCase{"QSourceHeadCount",
                [](Case& c) { c.q_source = Case::QSource{3, {0, 1}, {0, 1}, 1, {}}; },
                "q_source.head_ids"},
        BadCase{"QSourceHeadRange",
                [](Case& c) { c.q_source = Case::QSource{2, {0, 1}, {0, 1, 2}, 1, {}}; },
                "q_source.head_ids[2]"},
        BadCase{"QSourceHeads", [](Case& c) { c.q_source = Case::QSource{0, {0, 1}, {0, 0, 0}, 1, {}}; },
                "q_source.heads"},
        BadCase{"SinkNaN",
                [](Case& c) {
                  c.sink = std::vector<double>{0, std::numeric_limits<double>::quiet_NaN(), 0};
                },
                "sink[1]"},
        BadCase{"SmScaleInf",
                [](Case& c) { c.sm_scale = std::numeric_limits<double>::infinity(); },
                "sm_scale"},
        BadCase{"SmScaleBeyondFp32", [](Case& c) { c.sm_scale = 1e300; }, "sm_scale"},
        BadCase{"QPad", [](Case& c) { c.q_head_pad = -1; }, "q_head_pad"},
        BadCase{"OutPad", [](Case& c) { c.out_head_pad = -1; }, "out_head_pad"},
        BadCase{"MagnitudeInf",
                [](Case& c) { c.kv_values.magnitude = std::numeric_limits<double>::infinity(); },
                "kv_values.magnitude"},
        BadCase{"MagnitudeHuge", [](Case& c) { c.q_values.magnitude = 1e31; },
                "q_values.magnitude"},
        BadCase{"SpecialFraction", [](Case& c) { c.rope_values.special_fraction = 2; },
                "rope_values.special_fraction"},
        BadCase{"ExpLo", [](Case& c) { c.scales.exp_lo = -1; }, "scales.exp_lo"},
        BadCase{"ExpHiNaNByte", [](Case& c) { c.scales.exp_hi = 255; }, "scales.exp_hi"},
        BadCase{"ExpOrder",
                [](Case& c) {
                  c.scales.exp_lo = 130;
                  c.scales.exp_hi = 120;
                },
                "scales.exp_hi"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

// validate(c) refuses c naming `field`, with exactly `reason`.
void expect_refused(const Case& c, const std::string& field, const std::string& reason) {
  try {
    validate(c);
    FAIL() << "accepted";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), field);
    EXPECT_EQ(e.reason(), reason);
  }
}

TEST(CaseValidation, AnyNegativeConventionAcceptsOtherNegatives) {
  Case c = small_case();
  c.indices = {{0, -7, 2, 3, 4, 5, 6}, {-1, 13, -100, 0, 0, 1, 2}};
  expect_refused(c, "indices[0][1]",
                 "-7 is negative but not -1, undefined behaviour under conventions.invalid_index "
                 "\"minus_one_only\"");
  c.indices[0][1] = 99;  // past the 3 pages of 5 slots
  expect_refused(c, "indices[0][1]",
                 "99 is out of range: the cache has num_pages * page_size = 15 slots (only "
                 "conventions.invalid_index \"out_of_range\" makes it an invalid entry)");
  c.indices[0][1] = -7;
  c.conventions.invalid_index = mla::InvalidIndexRule::kAnyNegative;
  EXPECT_NO_THROW(validate(c));
}

TEST(CaseFiles, SaveThenLoad) {
  TempDir dir;
  const Case c = everything_case();
  save_case(c, dir.file("c.json"));
  expect_same(load_case(dir.file("c.json")), c);
  // No temporary file is left next to it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(CaseFiles, InvalidCaseWritesNothing) {
  TempDir dir;
  Case c = small_case();
  c.geom.page_stride = 1;
  EXPECT_THROW(save_case(c, dir.file("bad.json")), CaseError);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  // And an existing file is left untouched.
  write_file_atomic(dir.file("keep.json"), "old");
  EXPECT_THROW(save_case(c, dir.file("keep.json")), CaseError);
  EXPECT_EQ(read_file(dir.file("keep.json")), "old");
}

TEST(CaseFiles, LoadsACorpusEntry) {
  TempDir dir;
  json entry;
  entry["format"] = "mlafuzz-corpus";
  entry["version"] = 1;
  entry["case"] = case_to_json_value(everything_case());
  entry["finding"] = json{{"property", "agrees_with_oracle"}};
  write_file_atomic(dir.file("entry.json"), json_to_text(entry));
  expect_same(load_case(dir.file("entry.json")), everything_case());
}

TEST(CaseFiles, MissingFileNamesThePath) {
  try {
    load_case("/nonexistent/case.json");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/case.json"), std::string::npos);
  }
}

TEST(CaseFiles, ErrorsNameTheFile) {
  TempDir dir;
  write_file_atomic(dir.file("c.json"), R"({"version": 1, "topk": -3})");
  try {
    load_case(dir.file("c.json"));
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "topk");
    EXPECT_NE(std::string(e.what()).find("c.json"), std::string::npos);
  }
}

// Version 2: the batch-row pads round-trip, are omitted when 0, and are validated by name; a
// version-1 file loads and means the same (no pads), and cannot carry version-2 fields.
TEST(CaseJson, RowPadsRoundTripAndVersionOneStillLoads) {
  Case c = testing::small_case();
  c.q_batch_pad = 5;
  c.out_batch_pad = 6;
  c.indices_row_pad = 7;
  c.lse_row_pad = 8;
  const std::string text = to_json(c);
  EXPECT_NE(text.find("\"version\": 2"), std::string::npos);
  EXPECT_NE(text.find("\"indices_row_pad\": 7"), std::string::npos);
  expect_same(case_from_json(text), c);
  EXPECT_EQ(to_json(testing::small_case()).find("row_pad"), std::string::npos);
  EXPECT_EQ(to_json(testing::small_case()).find("batch_pad"), std::string::npos);

  const Case v1 = case_from_json(R"({"version": 1, "batch": 2, "heads": 3, "topk": 7})");
  EXPECT_EQ(v1.version, kCaseFormatVersion);
  EXPECT_EQ(v1.q_batch_pad + v1.out_batch_pad + v1.indices_row_pad + v1.lse_row_pad, 0);
  try {
    case_from_json(R"({"version": 1, "lse_row_pad": 2})");
    ADD_FAILURE() << "a version-1 file with a version-2 field must not load";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "lse_row_pad");
    EXPECT_NE(e.reason().find("version 2"), std::string::npos) << e.what();
  }
  for (const char* field : {"q_batch_pad", "out_batch_pad", "indices_row_pad", "lse_row_pad"}) {
    try {
      case_from_json(std::string(R"({"version": 2, ")") + field + R"(": -1})");
      ADD_FAILURE() << field << " -1 accepted";
    } catch (const CaseError& e) {
      EXPECT_EQ(e.field(), field);
    }
  }
}

}  // namespace
}  // namespace mlafuzz
