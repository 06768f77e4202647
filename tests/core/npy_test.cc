// .npy encoding: header layout per the NumPy format specification, version 1.0.
#include "core/npy.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/fileio.h"
#include "tests/core/test_util.h"

namespace mlafuzz {
namespace {

// Splits an encoded file into (header dict text, data bytes), checking the fixed prefix.
std::pair<std::string, std::string> parse(const std::string& f) {
  EXPECT_GE(f.size(), 10u);
  EXPECT_EQ(f.substr(0, 6), std::string("\x93NUMPY", 6));
  EXPECT_EQ(f[6], 1);  // major version
  EXPECT_EQ(f[7], 0);  // minor version
  const size_t len = static_cast<uint8_t>(f[8]) | (static_cast<uint8_t>(f[9]) << 8);
  EXPECT_EQ((10 + len) % 64, 0u) << "data must start 64-byte aligned";
  const std::string header = f.substr(10, len);
  EXPECT_EQ(header.back(), '\n');
  return {header, f.substr(10 + len)};
}

TEST(Npy, HeaderForEachTypeAndShape) {
  const float f[6] = {1, 2, 3, 4, 5, 6};
  auto [h, data] = parse(npy_encode(NpyType::kFloat32, {2, 3}, f, sizeof f));
  EXPECT_EQ(h.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u) << h;
  ASSERT_EQ(data.size(), sizeof f);
  EXPECT_EQ(std::memcmp(data.data(), f, sizeof f), 0);

  const int32_t i[5] = {-1, 0, 1, 2, 3};
  std::tie(h, data) = parse(npy_encode(NpyType::kInt32, {5}, i, sizeof i));
  EXPECT_NE(h.find("'descr': '<i4'"), std::string::npos);
  EXPECT_NE(h.find("'shape': (5,)"), std::string::npos) << h;

  const double d = 2.5;
  std::tie(h, data) = parse(npy_encode(NpyType::kFloat64, {}, &d, sizeof d));
  EXPECT_NE(h.find("'descr': '<f8'"), std::string::npos);
  EXPECT_NE(h.find("'shape': ()"), std::string::npos) << h;

  std::tie(h, data) = parse(npy_encode(NpyType::kUint8, {0, 4}, nullptr, 0));
  EXPECT_NE(h.find("'descr': '|u1'"), std::string::npos);
  EXPECT_TRUE(data.empty());

  const uint16_t u[2] = {0x3f80, 0x7fc0};
  std::tie(h, data) = parse(npy_encode(NpyType::kUint16, {1, 1, 2}, u, sizeof u));
  EXPECT_NE(h.find("'descr': '<u2'"), std::string::npos);
  EXPECT_NE(h.find("'shape': (1, 1, 2)"), std::string::npos);
  EXPECT_EQ(static_cast<uint8_t>(data[0]), 0x80);  // little-endian
  EXPECT_EQ(static_cast<uint8_t>(data[1]), 0x3f);
}

TEST(Npy, SizeMismatchIsRejected) {
  const float f[3] = {};
  EXPECT_THROW(npy_encode(NpyType::kFloat32, {2, 2}, f, sizeof f), std::invalid_argument);
  EXPECT_THROW(npy_encode(NpyType::kFloat32, {-1}, f, sizeof f), std::invalid_argument);
}

TEST(Npy, WritesAtomically) {
  testing::TempDir dir;
  write_npy(dir.file("a.npy"), std::vector<double>{1, 2, 3}, {3});
  const std::string f = read_file(dir.file("a.npy"));
  auto [h, data] = parse(f);
  EXPECT_EQ(data.size(), 24u);
  EXPECT_THROW(write_npy(dir.path() + "/missing/a.npy", std::vector<double>{1}, {1}),
               std::runtime_error);
}

}  // namespace
}  // namespace mlafuzz
