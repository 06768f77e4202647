#include "core/npy.h"

#include <bit>
#include <stdexcept>

#include "core/fileio.h"

namespace mlafuzz {

static_assert(std::endian::native == std::endian::little,
              ".npy files are written with little-endian descr strings");

const char* npy_descr(NpyType t) {
  switch (t) {
    case NpyType::kUint8:
      return "|u1";
    case NpyType::kUint16:
      return "<u2";
    case NpyType::kInt32:
      return "<i4";
    case NpyType::kFloat32:
      return "<f4";
    case NpyType::kFloat64:
      return "<f8";
  }
  return "?";
}

size_t npy_item_size(NpyType t) {
  switch (t) {
    case NpyType::kUint8:
      return 1;
    case NpyType::kUint16:
      return 2;
    case NpyType::kInt32:
    case NpyType::kFloat32:
      return 4;
    case NpyType::kFloat64:
      return 8;
  }
  return 0;
}

std::string npy_encode(NpyType t, const std::vector<int64_t>& shape, const void* data,
                       size_t bytes) {
  size_t count = 1;
  std::string dims;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("npy: negative dimension " + std::to_string(d));
    count *= static_cast<size_t>(d);
    dims += std::to_string(d) + ", ";
  }
  if (shape.size() > 1)
    dims.resize(dims.size() - 2);  // "(2, 3)" but "(5,)" and "()"
  else if (shape.size() == 1)
    dims.resize(dims.size() - 1);
  if (count * npy_item_size(t) != bytes) {
    throw std::invalid_argument("npy: " + std::to_string(bytes) + " bytes do not match shape (" +
                                dims + ") of " + npy_descr(t));
  }
  std::string header = "{'descr': '" + std::string(npy_descr(t)) +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic (6) + version (2) + header length (2) + header, padded with spaces and a final
  // newline to a multiple of 64 bytes.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  if (bytes > 0) out.append(static_cast<const char*>(data), bytes);
  return out;
}

void write_npy_bytes(const std::string& path, NpyType t, const std::vector<int64_t>& shape,
                     const void* data, size_t bytes) {
  write_file_atomic(path, npy_encode(t, shape, data, bytes));
}

}  // namespace mlafuzz
