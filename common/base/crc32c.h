// CRC32C (Castagnoli), as used by tensor_bundle and TFRecord. Debian's Abseil
// predates absl/crc, so it lives here. Thread-safe.
#ifndef PSTRAIN_COMMON_BASE_CRC32C_H_
#define PSTRAIN_COMMON_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace pstrain {

// Extends `crc` (0 to start) over `n` bytes: with the SSE4.2 instruction
// where the CPU has it, else with tables.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
// The table-driven code alone (tests compare the two).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_CRC32C_H_
