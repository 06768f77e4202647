#include "harness/campaign/worker_protocol.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "core/backend_traits.h"
#include "core/case.h"
#include "core/envelope.h"
#include "core/json_fields.h"
#include "core/shared_arena.h"

namespace mlafuzz::campaign {
namespace {

// Vectors of at least this many bytes travel out of line when a frame has a bulk area.
constexpr size_t kBulkThreshold = 4096;
constexpr size_t kBulkAlign = 64;

size_t align_up(size_t n) { return (n + kBulkAlign - 1) / kBulkAlign * kBulkAlign; }

// Whether v may travel as a reference to `base` (flag 2): at least kBulkThreshold bytes, equal
// (the very same buffer, as a case's variants share its cache, or the same bytes).
template <typename T, typename A>
bool same_bytes(const std::vector<T, A>& v, const std::vector<T, A>* base) {
  const size_t bytes = v.size() * sizeof(T);
  return base != nullptr && bytes >= kBulkThreshold && base->size() == v.size() &&
         (base->data() == v.data() || std::memcmp(base->data(), v.data(), bytes) == 0);
}

class Writer {
 public:
  // Large vectors go to `bulk` (from bulk->used on) when it is given and has room.
  explicit Writer(BulkArea* bulk = nullptr) : bulk_(bulk) {}
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    out_.append(s);
  }
  // As vec(v), or a reference (flag 2) to the same vector of the batch's first case when `same`.
  template <typename T, typename A>
  void vec_or_same(const std::vector<T, A>& v, bool same) {
    if (same) {
      pod<uint64_t>(v.size());
      pod<uint8_t>(2);
      return;
    }
    vec(v);
  }
  template <typename T, typename A>
  void vec(const std::vector<T, A>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    pod<uint64_t>(v.size());
    const size_t bytes = v.size() * sizeof(T);
    if (bulk_ != nullptr && bulk_->use_arena && bytes >= kBulkThreshold) {
      // Protocol 2: in the parent's shared arena already; the worker reads it there.
      if (const SharedArena* a = SharedArena::get()) {
        if (const int64_t off = a->offset_of(v.data(), bytes); off >= 0) {
          pod<uint8_t>(3);
          pod<uint64_t>(static_cast<uint64_t>(off));
          return;
        }
      }
    }
    const size_t at = bulk_ != nullptr ? align_up(bulk_->used) : 0;
    if (bulk_ != nullptr && bytes >= kBulkThreshold && at + bytes <= bulk_->size) {
      pod<uint8_t>(1);
      pod<uint64_t>(at);
      std::memcpy(bulk_->data + at, v.data(), bytes);
      bulk_->used = at + bytes;
      return;
    }
    pod<uint8_t>(0);
    if (bytes > 0) out_.append(reinterpret_cast<const char*>(v.data()), bytes);
  }
  std::string take() { return std::move(out_); }

 private:
  BulkArea* bulk_;
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view b, const BulkArea* bulk = nullptr) : b_(b), bulk_(bulk) {}
  template <typename T>
  T pod() {
    T v;
    need(sizeof v);
    std::memcpy(&v, b_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string str() {
    const uint64_t n = pod<uint64_t>();
    need(n);
    std::string s(b_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  // As vec(), also accepting a reference to another case's vector (flag 2): then the vector is
  // left empty and *same is set.
  template <typename T, typename A = std::allocator<T>>
  std::vector<T, A> vec_or_same(bool* same) {
    const size_t at = pos_;
    (void)pod<uint64_t>();
    if (pod<uint8_t>() == 2) {
      *same = true;
      return {};
    }
    pos_ = at;
    *same = false;
    return vec<T, A>();
  }
  template <typename T, typename A = std::allocator<T>>
  std::vector<T, A> vec() {
    const uint64_t n = pod<uint64_t>();
    const uint8_t flag = pod<uint8_t>();
    if (flag == 2 || flag > 3) throw ProtocolError("vector reference outside a batch");
    if (flag == 3) {
      const uint64_t at = pod<uint64_t>();
      if (bulk_ == nullptr || bulk_->arena == nullptr) {
        throw ProtocolError("vector in the shared arena, but the worker has no --arena-fd");
      }
      if (at > bulk_->arena_size || n > (bulk_->arena_size - at) / sizeof(T)) {
        throw ProtocolError("vector outside the shared arena");
      }
      std::vector<T, A> v(n);
      std::memcpy(v.data(), bulk_->arena + at, n * sizeof(T));
      return v;
    }
    if (flag != 0) {
      const uint64_t at = pod<uint64_t>();
      if (bulk_ == nullptr || at > bulk_->size || n > (bulk_->size - at) / sizeof(T)) {
        throw ProtocolError("vector outside the bulk area");
      }
      std::vector<T, A> v(n);
      std::memcpy(v.data(), bulk_->data + at, n * sizeof(T));
      return v;
    }
    if (n > (b_.size() - pos_) / sizeof(T)) throw ProtocolError("truncated vector in frame");
    std::vector<T, A> v(n);
    // memcpy needs valid pointers even for 0 bytes: an empty vector's data() may be null.
    if (n > 0) std::memcpy(v.data(), b_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  void end() const {
    if (pos_ != b_.size()) throw ProtocolError("trailing bytes in frame");
  }

 private:
  void need(uint64_t n) const {
    if (n > b_.size() - pos_) throw ProtocolError("truncated frame");
  }
  std::string_view b_;
  const BulkArea* bulk_;
  size_t pos_ = 0;
};

}  // namespace

namespace {

// One case into `w`; the vectors whose bit is set in `lent` (batch_same_masks: 0 q, 1 cache,
// 2 indices, 3 topk_length, 4 sink, 5 extra_cache, 6 extra_indices, 7 extra_topk_length) as
// references to the batch's first case.
void write_case(Writer& w, const MaterializedCase& m, uint32_t lent = 0) {
  // The recipe does not travel: backends read the buffers and the fields below (the recipe's JSON
  // cost a third of a small call's host time on the H200).
  const auto bit = [lent](int i) { return (lent & (1u << i)) != 0; };
  w.pod(m.geom);
  w.pod(m.batch);
  w.pod(m.heads);
  w.pod(m.topk);
  w.pod(m.sm_scale);
  w.pod(m.sm_scale64);
  w.pod(m.conv);
  w.vec_or_same(m.q, bit(0));
  w.pod(m.q_head_stride);
  w.vec_or_same(m.cache.vec(), bit(1));
  w.vec_or_same(m.indices, bit(2));
  w.vec_or_same(m.topk_length, bit(3));
  w.vec_or_same(m.sink, bit(4));
  w.pod(m.out_head_stride);
  // The production decode (case format version 2): query tokens, every stride, the extra cache.
  w.pod(m.s_q);
  for (int64_t v :
       {m.q_token_stride, m.q_batch_stride, m.indices_token_stride, m.indices_batch_stride,
        m.out_token_stride, m.out_batch_stride, m.lse_token_stride, m.lse_batch_stride}) {
    w.pod(v);
  }
  w.pod(m.split_override);
  w.pod(static_cast<int32_t>(m.has_extra));
  if (m.has_extra) {
    w.pod(m.extra_geom);
    w.pod(m.extra_topk);
    w.vec_or_same(m.extra_cache.vec(), bit(5));
    w.vec_or_same(m.extra_indices, bit(6));
    w.pod(m.extra_indices_token_stride);
    w.pod(m.extra_indices_batch_stride);
    w.vec_or_same(m.extra_topk_length, bit(7));
  }
}

// One case from `r`; references allowed only when `same` is given (a batch's later cases).
MaterializedCase read_case(Reader& r, uint32_t* same) {
  MaterializedCase m;
  m.geom = r.pod<mla::CacheGeometry>();
  m.batch = r.pod<int32_t>();
  m.heads = r.pod<int32_t>();
  m.topk = r.pod<int32_t>();
  // What of the recipe describes the buffers (the recipe itself stays with the campaign).
  m.recipe.geom = m.geom;
  m.recipe.batch = m.batch;
  m.recipe.heads = m.heads;
  m.recipe.topk = m.topk;
  m.sm_scale = r.pod<float>();
  m.sm_scale64 = r.pod<double>();
  m.conv = r.pod<mla::Conventions>();
  auto vec = [&]<typename T, typename A>(int bit, std::vector<T, A>& out) {
    if (same == nullptr) {
      out = r.template vec<T, A>();
      return;
    }
    bool s = false;
    out = r.template vec_or_same<T, A>(&s);
    if (s) *same |= 1u << bit;
  };
  vec(0, m.q);
  m.q_head_stride = r.pod<int64_t>();
  vec(1, m.cache.replace());
  vec(2, m.indices);
  vec(3, m.topk_length);
  vec(4, m.sink);
  m.out_head_stride = r.pod<int64_t>();
  m.s_q = r.pod<int32_t>();
  m.recipe.s_q = m.s_q;
  for (int64_t* v :
       {&m.q_token_stride, &m.q_batch_stride, &m.indices_token_stride, &m.indices_batch_stride,
        &m.out_token_stride, &m.out_batch_stride, &m.lse_token_stride, &m.lse_batch_stride}) {
    *v = r.pod<int64_t>();
  }
  m.split_override = r.pod<int32_t>();
  m.has_extra = r.pod<int32_t>() != 0;
  if (m.has_extra) {
    m.extra_geom = r.pod<mla::CacheGeometry>();
    m.extra_topk = r.pod<int32_t>();
    vec(5, m.extra_cache.replace());
    vec(6, m.extra_indices);
    m.extra_indices_token_stride = r.pod<int64_t>();
    m.extra_indices_batch_stride = r.pod<int64_t>();
    vec(7, m.extra_topk_length);
    // What of the recipe describes the extra cache (backends' unsupported() may look).
    ExtraCache e;
    e.page_size = m.extra_geom.page_size;
    e.page_stride = m.extra_geom.page_stride;
    e.num_pages = m.extra_geom.num_pages;
    e.topk = m.extra_topk;
    // A lent vector arrives empty; the lengths' presence is what the recipe needs.
    if (!m.extra_topk_length.empty() || (same != nullptr && (*same & (1u << 7)))) {
      e.topk_length = m.extra_topk_length;
    }
    m.recipe.extra = e;
  }
  return m;
}

}  // namespace

std::string encode_case(const MaterializedCase& m, BulkArea* bulk) {
  Writer w(bulk);
  write_case(w, m);
  return w.take();
}

MaterializedCase decode_case(std::string_view bytes, const BulkArea* bulk) {
  Reader r(bytes, bulk);
  MaterializedCase m = read_case(r, nullptr);
  r.end();
  return m;
}

std::string encode_batch(const std::vector<const MaterializedCase*>& cases, BulkArea* bulk,
                         const std::vector<uint32_t>* same) {
  if (same != nullptr && same->size() != cases.size()) {
    throw std::logic_error("encode_batch: one mask per case");
  }
  const std::vector<uint32_t> computed =
      same == nullptr ? batch_same_masks(cases) : std::vector<uint32_t>{};
  const std::vector<uint32_t>& masks = same != nullptr ? *same : computed;
  Writer w(bulk);
  w.pod(static_cast<uint32_t>(cases.size()));
  for (size_t k = 0; k < cases.size(); ++k) write_case(w, *cases[k], k == 0 ? 0 : masks[k]);
  return w.take();
}

std::vector<uint32_t> batch_same_masks(const std::vector<const MaterializedCase*>& cases) {
  std::vector<uint32_t> masks(cases.size(), 0);
  for (size_t k = 1; k < cases.size(); ++k) {
    const MaterializedCase& m = *cases[k];
    const MaterializedCase& b = *cases[0];
    uint32_t x = 0;
    if (same_bytes(m.q, &b.q)) x |= 1u << 0;
    if (same_bytes(m.cache.vec(), &b.cache.vec())) x |= 1u << 1;
    if (same_bytes(m.indices, &b.indices)) x |= 1u << 2;
    if (same_bytes(m.topk_length, &b.topk_length)) x |= 1u << 3;
    if (same_bytes(m.sink, &b.sink)) x |= 1u << 4;
    if (m.has_extra && b.has_extra) {
      if (same_bytes(m.extra_cache.vec(), &b.extra_cache.vec())) x |= 1u << 5;
      if (same_bytes(m.extra_indices, &b.extra_indices)) x |= 1u << 6;
      if (same_bytes(m.extra_topk_length, &b.extra_topk_length)) x |= 1u << 7;
    }
    masks[k] = x;
  }
  return masks;
}

DecodedBatch decode_batch(std::string_view bytes, const BulkArea* bulk) {
  Reader r(bytes, bulk);
  DecodedBatch b;
  const uint32_t n = r.pod<uint32_t>();
  if (n > bytes.size()) throw ProtocolError("batch count larger than its frame");
  b.cases.reserve(n);
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t same = 0;
    b.cases.push_back(read_case(r, k == 0 ? nullptr : &same));
    b.same_as_first.push_back(same);
  }
  r.end();
  return b;
}

void swap_vectors(MaterializedCase& a, MaterializedCase& b, uint32_t mask) {
  if (mask & (1u << 0)) a.q.swap(b.q);
  if (mask & (1u << 1)) a.cache.swap(b.cache);
  if (mask & (1u << 2)) a.indices.swap(b.indices);
  if (mask & (1u << 3)) a.topk_length.swap(b.topk_length);
  if (mask & (1u << 4)) a.sink.swap(b.sink);
  if (mask & (1u << 5)) a.extra_cache.swap(b.extra_cache);
  if (mask & (1u << 6)) a.extra_indices.swap(b.extra_indices);
  if (mask & (1u << 7)) a.extra_topk_length.swap(b.extra_topk_length);
}

namespace {

void write_result(Writer& w, const RunResult& x) {
  w.pod(static_cast<int32_t>(x.status));
  w.str(x.message);
  w.vec(x.out);
  w.vec(x.lse);
  w.vec(x.out_raw);
  w.vec(x.lse_raw);
  w.pod<uint8_t>(x.outputs_pending);  // protocol 2: out and lse left to widen_raw_outputs
  w.pod(x.guard_violations);
  w.pod(x.seconds);
  for (double s : x.phases.seconds) w.pod(s);
}

RunResult read_result(Reader& r) {
  RunResult x;
  const int32_t status = r.pod<int32_t>();
  if (status < 0 || status > static_cast<int32_t>(RunStatus::kFault)) {
    throw ProtocolError("bad run status " + std::to_string(status));
  }
  x.status = static_cast<RunStatus>(status);
  x.message = r.str();
  x.out = r.vec<double>();
  x.lse = r.vec<double>();
  x.out_raw = r.vec<uint16_t>();
  x.lse_raw = r.vec<float>();
  x.outputs_pending = r.pod<uint8_t>() != 0;
  x.guard_violations = r.pod<int64_t>();
  x.seconds = r.pod<double>();
  for (double& s : x.phases.seconds) s = r.pod<double>();
  return x;
}

}  // namespace

std::string encode_result(const RunResult& x, BulkArea* bulk) {
  Writer w(bulk);
  write_result(w, x);
  return w.take();
}

RunResult decode_result(std::string_view bytes, const BulkArea* bulk) {
  Reader r(bytes, bulk);
  RunResult x = read_result(r);
  r.end();
  return x;
}

std::string encode_checked(const std::optional<std::string>& unsupported, const RunResult& x,
                           BulkArea* bulk) {
  Writer w(bulk);
  w.pod<uint8_t>(unsupported ? 1 : 0);
  if (unsupported) {
    w.str(*unsupported);
  } else {
    write_result(w, x);
  }
  return w.take();
}

CheckedRun decode_checked(std::string_view bytes, const BulkArea* bulk) {
  Reader r(bytes, bulk);
  CheckedRun c;
  if (r.pod<uint8_t>() != 0) {
    c.unsupported = r.str();
  } else {
    c.result = read_result(r);
  }
  r.end();
  return c;
}

std::string encode_info(const WorkerInfo& i) {
  Writer w;
  w.pod(i.protocol);
  w.pod(i.pid);
  w.str(fields::write(i.traits, backend_traits_fields()).dump());
  return w.take();
}

WorkerInfo decode_info(std::string_view bytes) {
  Reader r(bytes);
  WorkerInfo i;
  i.protocol = r.pod<int32_t>();
  if (i.protocol != kWorkerProtocolVersion) {
    throw ProtocolError("the worker speaks protocol " + std::to_string(i.protocol) +
                        ", this mlafuzz " + std::to_string(kWorkerProtocolVersion) +
                        " (MLAFUZZ_WORKER_EXE names another build?): use one mlafuzz binary");
  }
  i.pid = r.pod<int32_t>();
  const std::string text = r.str();
  r.end();
  try {
    fields::read(nlohmann::ordered_json::parse(text), i.traits, backend_traits_fields(),
                 {.path = "info", .unknown_is_error = true});
  } catch (const std::exception& e) {  // parse errors, FieldError, the envelope's invalid_argument
    throw ProtocolError(std::string("malformed info: ") + e.what());
  }
  return i;
}

size_t bulk_bytes_needed(const MaterializedCase& m) {
  // Every vector of the case, then every vector of its result (out and lse as float64 and raw,
  // guard bands included), each aligned.
  const size_t heads = static_cast<size_t>(m.query_rows()) * m.heads;
  const size_t out = heads * m.d_v();
  const size_t rows = static_cast<size_t>(m.batch);
  const size_t out_raw =
      2 * OutputBuffers::kGuard +
      std::max(rows * static_cast<size_t>(std::max<int64_t>(m.out_batch_stride, 0)),
               heads * std::max<size_t>(m.out_head_stride, m.d_v()));
  const size_t lse_raw =
      2 * OutputBuffers::kGuard +
      std::max(rows * static_cast<size_t>(std::max<int64_t>(m.lse_batch_stride, 0)), heads);
  const size_t sizes[] = {m.q.size() * 2,
                          m.cache.size(),
                          m.indices.size() * 4,
                          m.topk_length.size() * 4,
                          m.sink.size() * 4,
                          m.extra_cache.size(),
                          m.extra_indices.size() * 4,
                          m.extra_topk_length.size() * 4,
                          out * 8,
                          heads * 8,
                          out_raw * 2,
                          lse_raw * 4};
  size_t total = 0;
  for (size_t s : sizes) total += align_up(s);
  return total;
}

std::string frame_header(MsgType type, uint64_t length) {
  Writer w;
  w.pod(kFrameMagic);
  w.pod(static_cast<uint32_t>(type));
  w.pod(length);
  return w.take();
}

namespace {

bool read_exact(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool write_exact(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

bool read_frame_blocking(int fd, MsgType& type, std::string& payload) {
  char h[16];
  if (!read_exact(fd, h, sizeof h)) return false;
  uint32_t magic, t;
  uint64_t len;
  std::memcpy(&magic, h, 4);
  std::memcpy(&t, h + 4, 4);
  std::memcpy(&len, h + 8, 8);
  if (magic != kFrameMagic) throw ProtocolError("bad frame magic");
  if (len > (uint64_t{1} << 36)) throw ProtocolError("frame too large");
  type = static_cast<MsgType>(t);
  payload.resize(len);
  return read_exact(fd, payload.data(), len);
}

bool write_frame_blocking(int fd, MsgType type, std::string_view payload) {
  const std::string h = frame_header(type, payload.size());
  return write_exact(fd, h.data(), h.size()) && write_exact(fd, payload.data(), payload.size());
}

}  // namespace mlafuzz::campaign
