// Deterministic placement of variables on parameter servers. Every party (chief,
// workers, servers, the CLI) computes the same placement from the same inputs:
// the variable list and the number of servers. Variables of at least
// `partition_min_bytes` are split into contiguous row partitions spread over
// distinct servers, and a variable larger than `partition_max_bytes` into
// enough partitions that none is larger (whole rows: a single row larger than
// that stays whole), spread over the servers in turn, so no tensor on the
// wire nears gRPC's message cap; the remaining pieces are balanced by bytes
// (largest first, each to the least-loaded server), never round-robin.
// Immutable once built.
#ifndef PSTRAIN_COMMON_CLUSTER_PLACEMENT_H_
#define PSTRAIN_COMMON_CLUSTER_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

struct VariableSpec {
  std::string name;
  std::vector<int64_t> shape;  // rank >= 1; partitions split dimension 0
  int64_t num_elements() const;
  int64_t row_elements() const;  // elements per row of dimension 0
};

struct Partition {
  int index = 0;  // position in the variable's partition list
  int server = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;  // exclusive
  int64_t num_rows() const { return row_end - row_begin; }
};

struct VariablePlacement {
  VariableSpec spec;
  std::vector<Partition> partitions;  // ordered by row_begin
};

class Placement {
 public:
  static absl::StatusOr<Placement> Compute(const std::vector<VariableSpec>& variables,
                                           int num_servers, int64_t partition_min_bytes,
                                           int64_t partition_max_bytes = 0);

  int num_servers() const { return num_servers_; }
  const std::vector<VariablePlacement>& variables() const { return variables_; }
  // nullptr when unknown.
  const VariablePlacement* Find(const std::string& name) const;
  // Bytes of float32 data per server.
  const std::vector<int64_t>& server_bytes() const { return server_bytes_; }
  // Human-readable plan: per server bytes, per variable its partitions.
  std::string DebugString() const;

 private:
  int num_servers_ = 0;
  std::vector<VariablePlacement> variables_;
  std::map<std::string, size_t> index_;
  std::vector<int64_t> server_bytes_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLUSTER_PLACEMENT_H_
