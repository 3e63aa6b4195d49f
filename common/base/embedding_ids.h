// Where an embedding row lives and how it starts, from its id alone: the
// client (which server to ask) and the servers (a row's first value) must
// agree, and neither may depend on the order rows are touched in.
//
// Ids are spread with Lamping and Veach's jump consistent hash of a mixed id
// (never id mod n: ids of one feature are often consecutive, or multiples of
// a stride), so every server gets an even share of any id set, and growing
// from n to n + 1 servers moves only 1/(n + 1) of the rows.
#ifndef PSTRAIN_COMMON_BASE_EMBEDDING_IDS_H_
#define PSTRAIN_COMMON_BASE_EMBEDDING_IDS_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace pstrain {

// SplitMix64's finaliser: a bijection of 64-bit values whose every output
// bit depends on every input bit.
inline uint64_t MixId(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Jump consistent hash: a bucket in [0, buckets) for `key`.
inline int JumpConsistentHash(uint64_t key, int buckets) {
  int64_t b = -1, j = 0;
  while (j < buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) *
                             (static_cast<double>(1LL << 31) /
                              static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int>(b);
}

// The server in [0, num_servers) that holds row `id` of any table.
inline int ServerForId(uint64_t id, int num_servers) {
  return JumpConsistentHash(MixId(id), num_servers);
}

// FNV-1a of a table's name, to give each table its own initial values.
inline uint64_t TableSeed(uint64_t run_seed, const std::string& table) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : table) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return MixId(run_seed ^ h);
}

// Row `id`'s initial values: uniform in [-scale, scale), element j drawn
// from (table seed, id, j) alone.
inline void InitialRow(uint64_t table_seed, uint64_t id, int dim, float scale, float* out) {
  const uint64_t base = MixId(table_seed ^ MixId(id));
  for (int j = 0; j < dim; ++j) {
    const uint64_t r = MixId(base + static_cast<uint64_t>(j));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    out[j] = (2.0f * u - 1.0f) * scale;
  }
}

// No id: an unused place among a multi-hot field's ids (an example holds
// max_values places for such a field; SparseBatch skips this). The readers
// never give it as an id (the one value that would hash to it takes the id
// below it).
constexpr uint64_t kNoId = ~uint64_t{0};

// The ids of categorical values come from an id space: field k's own
// (k + 1), or a vocabulary's, shared by the fields that name it (the hash
// of its name with the top bit set, so never a field's).
inline uint64_t FieldIdSpace(int field) { return static_cast<uint64_t>(field) + 1; }
inline uint64_t VocabularyIdSpace(const std::string& vocabulary) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : vocabulary) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h | (uint64_t{1} << 63);
}

// The 64-bit id of categorical value `value` in id space `space`: a hash of
// both, so equal strings in different spaces are different ids. An empty
// value (a missing field) is a category of its own in each space.
inline uint64_t SpaceFeatureId(uint64_t space, const char* value, size_t length) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < length; ++i) {
    h ^= static_cast<unsigned char>(value[i]);
    h *= 1099511628211ULL;
  }
  return MixId(h ^ (space * 0x9e3779b97f4a7c15ULL));
}
// The id of value `value` of feature field `field` (its own space).
inline uint64_t FeatureId(int field, const char* value, size_t length) {
  return SpaceFeatureId(FieldIdSpace(field), value, length);
}
inline uint64_t FeatureId(int field, const std::string& value) {
  return FeatureId(field, value.data(), value.size());
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_EMBEDDING_IDS_H_
