// Wire format between the campaign and `mlafuzz worker` processes (fault isolation).
//
// Frames over a pair of pipes (harness/backends/ipc_channel.h): u32 magic "MLAW", u32 message
// type, u64 payload length, payload. Integers are little-endian host order (both ends are the
// same binary on the same machine). Requests carry the buffers of MaterializedCases (not their
// recipes), because properties transform the buffers (poison, relocation, single rows) after
// materialization; replies carry RunResults. Vectors of 4 KiB and more travel through the
// worker's shared memory (BulkArea) when it has one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/materialize.h"

namespace mlafuzz::campaign {

inline constexpr uint32_t kFrameMagic = 0x57414c4d;  // "MLAW"
// Version of this wire format (INFO carries it; both ends refuse another). 3: the INFO reply
// carries the backend's BackendTraits as one JSON document. 2: results may carry only the raw
// outputs (RunResult::outputs_pending), and vectors may be read in the parent's shared arena
// (flag 3). 1: every result widened, every vector copied.
inline constexpr int32_t kWorkerProtocolVersion = 3;

enum class MsgType : uint32_t {
  kInfo = 1,         // request: empty; reply kInfo: WorkerInfo
  kUnsupported = 2,  // request: case; reply kUnsupported: u8 flag + reason
  kRun = 3,          // request: case; reply kRun: RunResult
  kQuit = 4,         // request: empty; the worker exits 0
  kError = 5,        // reply: text (the worker could not serve the request; it exits after)
  kRunBatch = 6,     // request: batch of cases; one reply kRunBatch per case, in order: CheckedRun
};

// The kInfo reply: who answers, and what its backend says about itself.
struct WorkerInfo {
  int32_t protocol = kWorkerProtocolVersion;
  int32_t pid = 0;
  BackendTraits traits;  // Backend::traits(), as JSON (backend_traits_fields) on the wire
};

// Thrown on a malformed payload.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Shared memory both ends map (the worker inherits it): vectors of 4 KiB and more travel there
// instead of through the pipe, from `used` on (the request's vectors first, then the reply's).
// Without one (or when it is full) they travel inline in the frame.
//
// The arena (protocol 2): the parent's vectors that live in its shared arena
// (core/shared_arena.h) travel as their offset there (flag 3), not copied into the bulk
// area; the worker maps the arena read-only (`mlafuzz worker --arena-fd`) and copies them out
// once. `arena` is the parent's SharedArena when writing (null: copy), the worker's read-only
// mapping when reading (null: a flag 3 vector is a protocol error).
struct BulkArea {
  uint8_t* data = nullptr;
  size_t size = 0;
  size_t used = 0;
  const uint8_t* arena = nullptr;  // reading: the mapped arena
  size_t arena_size = 0;
  bool use_arena = false;  // writing: send the parent's arena vectors by offset
};

std::string encode_case(const MaterializedCase& m, BulkArea* bulk = nullptr);
MaterializedCase decode_case(std::string_view bytes, const BulkArea* bulk = nullptr);
std::string encode_result(const RunResult& r, BulkArea* bulk = nullptr);
RunResult decode_result(std::string_view bytes, const BulkArea* bulk = nullptr);
// Bulk bytes a request for `m` and its reply take at most (what the parent reserves).
size_t bulk_bytes_needed(const MaterializedCase& m);

// A batch (kRunBatch): u32 count, then each case as encode_case writes it, except that a vector
// of 4 KiB or more byte-identical to the same vector of the batch's first case (the property
// variants share most of their buffers with each other) travels as a reference to it (flag 2):
// its bytes cross once per batch.
// `same`, when given, holds batch_same_masks(cases) computed before (so that the comparisons run
// outside the worker's lock, on the caller's thread); without it encode_batch compares.
std::string encode_batch(const std::vector<const MaterializedCase*>& cases, BulkArea* bulk,
                         const std::vector<uint32_t>* same = nullptr);
// Per case, the bits (as DecodedBatch::same_as_first) of its vectors of at least 4 KiB that hold
// the same bytes as cases[0]'s: what encode_batch sends as references. 0 for cases[0].
std::vector<uint32_t> batch_same_masks(const std::vector<const MaterializedCase*>& cases);
struct DecodedBatch {
  std::vector<MaterializedCase> cases;
  // Per case, bit i (0 q, 1 cache, 2 indices, 3 topk_length, 4 sink): the vector is left empty
  // in `cases[k]` and equals cases[0]'s (share_first lends it for the run).
  std::vector<uint32_t> same_as_first;
};
DecodedBatch decode_batch(std::string_view bytes, const BulkArea* bulk);
// Swaps the vectors named by `mask` between a and b (call again to swap back).
void swap_vectors(MaterializedCase& a, MaterializedCase& b, uint32_t mask);
// The reply to one case of a batch: u8 1 + reason when unsupported, else u8 0 + the result.
std::string encode_checked(const std::optional<std::string>& unsupported, const RunResult& r,
                           BulkArea* bulk);
CheckedRun decode_checked(std::string_view bytes, const BulkArea* bulk);
std::string encode_info(const WorkerInfo& w);
WorkerInfo decode_info(std::string_view bytes);

// Blocking frame I/O for the worker side (stdin/stdout). Returns false on EOF.
bool read_frame_blocking(int fd, MsgType& type, std::string& payload);
bool write_frame_blocking(int fd, MsgType type, std::string_view payload);

// Frame header bytes.
std::string frame_header(MsgType type, uint64_t length);

}  // namespace mlafuzz::campaign
