// bfloat16 for the optional reduced-precision wire: a float32's top 16 bits,
// rounded to nearest even. Finite values too large for bfloat16 saturate to
// its largest finite value (so a finite gradient never arrives as Inf); NaN
// stays NaN. Unaligned sources are fine (received bytes are read in place).
#ifndef PSTRAIN_COMMON_BASE_BFLOAT16_H_
#define PSTRAIN_COMMON_BASE_BFLOAT16_H_

#include <cstdint>
#include <cstring>

namespace pstrain {

inline uint16_t FloatToBfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    // Inf stays Inf; NaN stays a (quiet) NaN.
    return static_cast<uint16_t>((u >> 16) | ((u & 0x007fffffu) ? 0x0040u : 0u));
  }
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  uint16_t b = static_cast<uint16_t>(rounded >> 16);
  if ((b & 0x7f80u) == 0x7f80u) b = static_cast<uint16_t>((b & 0x8000u) | 0x7f7fu);  // saturate
  return b;
}

inline float Bfloat16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void FloatsToBfloat16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBfloat16(src[i]);
}

// n bfloat16 values at p (any alignment) to float32.
inline void Bfloat16ToFloats(const char* p, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    dst[i] = Bfloat16ToFloat(b);
  }
}

// True when none of the n bfloat16 values at p is Inf or NaN.
inline bool AllFiniteBfloat16(const char* p, int64_t n) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    ok &= (b & 0x7f80u) != 0x7f80u;
  }
  return ok;
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_BFLOAT16_H_
