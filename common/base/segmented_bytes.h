// A read-only view of bytes that arrive in pieces (the slices of a received
// gRPC message, or one protobuf string), so tensors can be validated, copied
// and applied straight from where the transport left them. The view owns
// nothing; whoever built it keeps the pieces alive. Float data may start at any
// byte and a float may straddle two pieces, so the float helpers hand out
// unaligned runs and bounce the rare straddling float through a local.
#ifndef PSTRAIN_COMMON_BASE_SEGMENTED_BYTES_H_
#define PSTRAIN_COMMON_BASE_SEGMENTED_BYTES_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/string_view.h"

namespace pstrain {

class SegmentedBytes {
 public:
  SegmentedBytes() = default;
  explicit SegmentedBytes(absl::string_view one) { Append(one); }

  void Append(absl::string_view piece);
  int64_t size() const { return size_; }
  int num_segments() const { return static_cast<int>(segments_.size()); }

  // Copies [offset, offset + bytes) to `dst`. The range must lie inside.
  void CopyTo(int64_t offset, int64_t bytes, void* dst) const;
  // Copies `count` floats from byte `offset` to `dst`: float32, or bfloat16
  // widened to float32 (2 bytes each on the wire).
  void CopyFloatsTo(int64_t offset, int64_t count, bool bfloat16, float* dst) const;

  // Calls `run(p, n)` over the `count` floats starting at byte `offset`, in
  // order: p points at n consecutive (possibly unaligned) little-endian
  // floats. The range must lie inside.
  void ForEachFloatRun(int64_t offset, int64_t count,
                       const std::function<void(const char* p, int64_t n)>& run) const {
    ForEachRun(offset, count, 4, run);
  }
  // The same for elements of `element_bytes` (2 for bfloat16, 4 for float).
  void ForEachRun(int64_t offset, int64_t count, int element_bytes,
                  const std::function<void(const char* p, int64_t n)>& run) const;

 private:
  // Index of the segment holding byte `offset`.
  size_t SegmentAt(int64_t offset) const;

  std::vector<absl::string_view> segments_;
  std::vector<int64_t> starts_;  // byte offset of each segment
  int64_t size_ = 0;
};

// Loads float i of an unaligned run.
inline float LoadFloat(const char* p, int64_t i) {
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}

// True when all n floats at p (unaligned) are finite.
bool AllFiniteUnaligned(const char* p, int64_t n);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_SEGMENTED_BYTES_H_
