#include "common/cluster/placement.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pstrain {

int64_t VariableSpec::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t VariableSpec::row_elements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

absl::StatusOr<Placement> Placement::Compute(const std::vector<VariableSpec>& variables,
                                             int num_servers, int64_t partition_min_bytes,
                                             int64_t partition_max_bytes) {
  if (num_servers <= 0) return absl::InvalidArgumentError("placement: no parameter servers");
  Placement p;
  p.num_servers_ = num_servers;
  p.server_bytes_.assign(num_servers, 0);
  std::set<std::string> names;
  for (const VariableSpec& v : variables) {
    if (v.name.empty() || !names.insert(v.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: variable names must be unique and non-empty: \"", v.name, "\""));
    }
    if (v.shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("placement: ", v.name, " has rank 0"));
    }
    for (int64_t d : v.shape) {
      if (d <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("placement: ", v.name, " has dim ", d));
      }
    }
  }

  // Pieces to place: (bytes, variable index, partition index).
  struct Piece {
    int64_t bytes;
    size_t var;
    int part;
  };
  std::vector<Piece> split_pieces, small_pieces;
  for (size_t vi = 0; vi < variables.size(); ++vi) {
    const VariableSpec& v = variables[vi];
    VariablePlacement vp{v, {}};
    const int64_t bytes = v.num_elements() * 4;
    const int64_t rows = v.shape[0];
    int parts = 1;
    if (partition_min_bytes > 0 && bytes >= partition_min_bytes && num_servers > 1) {
      int64_t want = std::max<int64_t>(2, bytes / partition_min_bytes);
      parts = static_cast<int>(std::min<int64_t>({want, num_servers, rows}));
    }
    const int64_t row_bytes = v.row_elements() * 4;
    if (partition_max_bytes > 0 && bytes > partition_max_bytes) {
      const int64_t rows_per_part = std::max<int64_t>(1, partition_max_bytes / row_bytes);
      parts = static_cast<int>(
          std::max<int64_t>(parts, std::min<int64_t>(rows, (rows + rows_per_part - 1) / rows_per_part)));
    }
    for (int k = 0; k < parts; ++k) {
      Partition part;
      part.index = k;
      part.row_begin = rows * k / parts;
      part.row_end = rows * (k + 1) / parts;
      vp.partitions.push_back(part);
      Piece piece{part.num_rows() * v.row_elements() * 4, vi, k};
      (parts > 1 ? split_pieces : small_pieces).push_back(piece);
    }
    p.variables_.push_back(std::move(vp));
  }

  auto least_loaded = [&p](const std::set<int>& exclude) {
    int best = -1;
    for (int s = 0; s < p.num_servers_; ++s) {
      if (exclude.count(s)) continue;
      if (best < 0 || p.server_bytes_[s] < p.server_bytes_[best]) best = s;
    }
    return best;
  };
  // Split variables first, largest first; a variable's partitions land on
  // distinct servers.
  std::vector<size_t> split_vars;
  for (size_t vi = 0; vi < p.variables_.size(); ++vi) {
    if (p.variables_[vi].partitions.size() > 1) split_vars.push_back(vi);
  }
  std::stable_sort(split_vars.begin(), split_vars.end(), [&](size_t a, size_t b) {
    return p.variables_[a].spec.num_elements() > p.variables_[b].spec.num_elements();
  });
  for (size_t vi : split_vars) {
    std::set<int> used;
    VariablePlacement& vp = p.variables_[vi];
    for (Partition& part : vp.partitions) {
      if (static_cast<int>(used.size()) == p.num_servers_) used.clear();  // more parts than servers
      int s = least_loaded(used);
      used.insert(s);
      part.server = s;
      p.server_bytes_[s] += part.num_rows() * vp.spec.row_elements() * 4;
    }
  }
  // Then the small ones: largest first, ties by name, to the least-loaded server.
  std::stable_sort(small_pieces.begin(), small_pieces.end(), [&](const Piece& a, const Piece& b) {
    return std::make_tuple(-a.bytes, variables[a.var].name) <
           std::make_tuple(-b.bytes, variables[b.var].name);
  });
  for (const Piece& piece : small_pieces) {
    int s = least_loaded({});
    p.variables_[piece.var].partitions[piece.part].server = s;
    p.server_bytes_[s] += piece.bytes;
  }
  for (size_t vi = 0; vi < p.variables_.size(); ++vi) p.index_[p.variables_[vi].spec.name] = vi;
  return p;
}

const VariablePlacement* Placement::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &variables_[it->second];
}

std::string Placement::DebugString() const {
  std::string out;
  for (int s = 0; s < num_servers_; ++s) {
    absl::StrAppend(&out, "ps:", s, " ", server_bytes_[s], " bytes\n");
  }
  for (const VariablePlacement& vp : variables_) {
    absl::StrAppend(&out, vp.spec.name, " [", absl::StrJoin(vp.spec.shape, ","), "]:");
    for (const Partition& part : vp.partitions) {
      absl::StrAppend(&out, " part", part.index, "=ps:", part.server, " rows[", part.row_begin,
                      ",", part.row_end, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace pstrain
