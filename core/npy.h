// NumPy .npy files (format version 1.0), so that anyone can load mlafuzz inputs and outputs
// with numpy.load and check them independently.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace mlafuzz {

enum class NpyType { kUint8, kUint16, kInt32, kFloat32, kFloat64 };

// The numpy dtype string, little-endian ("|u1", "<u2", "<i4", "<f4", "<f8").
const char* npy_descr(NpyType t);
size_t npy_item_size(NpyType t);

// The complete file: magic, version 1.0, header dict padded so the data starts at a multiple of
// 64 bytes (numpy's own alignment), then the raw little-endian C-order data. Throws
// std::invalid_argument when `bytes` does not match the shape.
std::string npy_encode(NpyType t, const std::vector<int64_t>& shape, const void* data,
                       size_t bytes);

// The NpyType of a C++ element type (compile error for any other type).
template <typename T>
constexpr NpyType npy_type_of() {
  static_assert(std::is_same_v<T, uint8_t> || std::is_same_v<T, uint16_t> ||
                    std::is_same_v<T, int32_t> || std::is_same_v<T, float> ||
                    std::is_same_v<T, double>,
                "no .npy type for this element type");
  if constexpr (std::is_same_v<T, uint8_t>) {
    return NpyType::kUint8;
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    return NpyType::kUint16;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return NpyType::kInt32;
  } else if constexpr (std::is_same_v<T, float>) {
    return NpyType::kFloat32;
  } else {
    return NpyType::kFloat64;
  }
}

// Writes an array atomically (see fileio.h). The host is little-endian (x86-64, aarch64), as
// the descr strings say.
void write_npy_bytes(const std::string& path, NpyType t, const std::vector<int64_t>& shape,
                     const void* data, size_t bytes);

template <typename T, typename A>
void write_npy(const std::string& path, const std::vector<T, A>& v,
               const std::vector<int64_t>& shape) {
  write_npy_bytes(path, npy_type_of<T>(), shape, v.data(), v.size() * sizeof(T));
}

}  // namespace mlafuzz
