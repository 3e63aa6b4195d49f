#include "common/client/ps_requests.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/embedding_ids.h"

namespace pstrain {

std::vector<PartitionGroup> GroupPartitions(const Placement& placement,
                                            const std::vector<size_t>& var_indices,
                                            int64_t chunk_bytes, int element_bytes,
                                            bool every_server) {
  const auto& vars = placement.variables();
  std::vector<PartitionGroup> groups;
  std::vector<int> open(placement.num_servers(), -1);  // per server, its current group
  std::vector<int64_t> open_bytes(placement.num_servers(), 0);
  for (size_t v : var_indices) {
    for (const Partition& part : vars[v].partitions) {
      const int64_t bytes = part.num_rows() * vars[v].spec.row_elements() * element_bytes;
      int& g = open[part.server];
      if (g < 0 || (chunk_bytes > 0 && open_bytes[part.server] > 0 &&
                    open_bytes[part.server] + bytes > chunk_bytes)) {
        g = static_cast<int>(groups.size());
        groups.push_back({part.server, {}});
        open_bytes[part.server] = 0;
      }
      groups[g].parts.emplace_back(v, &part);
      open_bytes[part.server] += bytes;
    }
  }
  for (int s = 0; every_server && s < placement.num_servers(); ++s) {
    if (open[s] < 0) groups.push_back({s, {}});
  }
  return groups;
}

std::vector<size_t> AllVariables(const Placement& placement) {
  std::vector<size_t> all(placement.variables().size());
  for (size_t v = 0; v < all.size(); ++v) all[v] = v;
  return all;
}

std::vector<int64_t> PartitionShape(const VariableSpec& spec, const Partition& part) {
  std::vector<int64_t> shape = spec.shape;
  shape[0] = part.num_rows();
  return shape;
}

void SetRef(const VariableSpec& spec, const Partition& part, PartitionRef* ref) {
  ref->set_variable(spec.name);
  ref->set_partition(part.index);
}

absl::StatusOr<InitializeCalls> InitializeRequests(
    const Placement& placement, uint64_t incarnation, const TrainingConfig& config,
    uint64_t fingerprint, int num_workers, int64_t start_step, const std::vector<Tensor>& params,
    const PsClient::OptimizerState* optimizer_state, int64_t part_bytes) {
  const auto& vars = placement.variables();
  if (params.size() != vars.size()) {
    return absl::InvalidArgumentError("InitializeAll: params do not match the placement");
  }
  if (optimizer_state != nullptr && (optimizer_state->slots.size() != vars.size() ||
                                     optimizer_state->updates.size() != vars.size())) {
    return absl::InvalidArgumentError("InitializeAll: optimizer state does not match the placement");
  }
  InitializeCalls calls(placement, config, params, optimizer_state);
  calls.incarnation_ = incarnation;
  calls.fingerprint_ = fingerprint;
  calls.num_workers_ = num_workers;
  calls.start_step_ = start_step;
  calls.groups_ =
      GroupPartitions(placement, AllVariables(placement), part_bytes, 4, /*every_server=*/true);
  calls.parts_.assign(placement.num_servers(), 0);
  for (const PartitionGroup& g : calls.groups_) calls.part_.push_back(calls.parts_[g.server]++);
  return calls;
}

InitializeRequest InitializeCalls::Request(size_t r) const {
  const auto& vars = placement_->variables();
  const int s = groups_[r].server;
  InitializeRequest req;
  req.set_incarnation(incarnation_);
  *req.mutable_config() = *config_;
  req.set_config_fingerprint(fingerprint_);
  req.set_num_workers(num_workers_);
  req.set_start_step(start_step_);
  req.set_part(part_[r]);
  req.set_num_parts(parts_[s]);
  req.set_server_index(s);
  req.set_num_servers(placement_->num_servers());
  for (const auto& [v, part] : groups_[r].parts) {
    const int64_t row = vars[v].spec.row_elements();
    NamedTensor* nt = req.add_variables();
    SetRef(vars[v].spec, *part, nt->mutable_ref());
    ToProto(PartitionShape(vars[v].spec, *part),
            absl::MakeConstSpan((*params_)[v].data() + part->row_begin * row,
                                part->num_rows() * row),
            nt->mutable_tensor());
    if (state_ != nullptr) {
      for (const std::vector<float>& slot : state_->slots[v]) {
        ToProto(PartitionShape(vars[v].spec, *part),
                absl::MakeConstSpan(slot.data() + part->row_begin * row, part->num_rows() * row),
                nt->add_slots());
      }
      nt->set_updates(state_->updates[v]);
    }
  }
  return req;
}

std::vector<std::vector<uint32_t>> RowsByServer(absl::Span<const uint64_t> ids, int servers) {
  std::vector<std::vector<uint32_t>> by(servers);
  for (size_t i = 0; i < ids.size(); ++i) {
    by[ServerForId(ids[i], servers)].push_back(static_cast<uint32_t>(i));
  }
  return by;
}

std::vector<int> ServersWithRows(const std::vector<std::vector<uint32_t>>& by) {
  std::vector<int> servers;
  for (size_t s = 0; s < by.size(); ++s) {
    if (!by[s].empty()) servers.push_back(static_cast<int>(s));
  }
  return servers;
}

std::string IdBytes(absl::Span<const uint64_t> ids, const std::vector<uint32_t>& positions) {
  std::string bytes(positions.size() * sizeof(uint64_t), '\0');
  char* p = bytes.data();
  for (uint32_t i : positions) {
    std::memcpy(p, &ids[i], sizeof(uint64_t));  // little-endian hosts
    p += sizeof(uint64_t);
  }
  return bytes;
}

std::vector<std::pair<int, LoadRowsRequest>> LoadRowsRequests(
    uint64_t incarnation, int num_servers, const std::string& table, int dim,
    absl::Span<const uint64_t> ids, const float* values, const std::vector<const float*>& slots,
    absl::Span<const int64_t> updates, absl::Span<const int64_t> touched) {
  const std::vector<std::vector<uint32_t>> by = RowsByServer(ids, num_servers);
  const size_t row_bytes = sizeof(float) * dim * (1 + slots.size()) + 3 * sizeof(int64_t);
  const size_t per_call = std::max<size_t>(1, (size_t{4} << 20) / row_bytes);
  // Gathers the rows at `positions` of an array of `width` elements each.
  auto gather = [](const void* base, size_t width, const std::vector<uint32_t>& positions) {
    std::string bytes(positions.size() * width, '\0');
    char* p = bytes.data();
    for (uint32_t i : positions) {
      std::memcpy(p, static_cast<const char*>(base) + static_cast<size_t>(i) * width, width);
      p += width;
    }
    return bytes;
  };
  std::vector<std::pair<int, LoadRowsRequest>> calls;
  for (int s = 0; s < num_servers; ++s) {
    for (size_t begin = 0; begin < by[s].size(); begin += per_call) {
      const std::vector<uint32_t> positions(
          by[s].begin() + begin, by[s].begin() + std::min(by[s].size(), begin + per_call));
      LoadRowsRequest& req = calls.emplace_back(s, LoadRowsRequest()).second;
      req.set_incarnation(incarnation);
      req.set_table(table);
      req.set_ids(IdBytes(ids, positions));
      req.set_values(gather(values, sizeof(float) * dim, positions));
      for (const float* slot : slots) *req.add_slots() = gather(slot, sizeof(float) * dim, positions);
      if (!updates.empty()) req.set_updates(gather(updates.data(), sizeof(int64_t), positions));
      if (!touched.empty()) req.set_touched(gather(touched.data(), sizeof(int64_t), positions));
    }
  }
  return calls;
}

PullAssembly::PullAssembly(const Placement& placement, int num_servers,
                           PsClient::PullResult* result)
    : placement_(placement), result_(result) {
  const auto& vars = placement.variables();
  result->versions.assign(num_servers, -1);
  result->finished = true;
  seen_.resize(vars.size());
  for (size_t v = 0; v < vars.size(); ++v) {
    seen_[v].assign(vars[v].partitions.size(), 0);
    expected_ += static_cast<int64_t>(vars[v].partitions.size());
  }
}

absl::StatusOr<PullAssembly::Part> PullAssembly::Take(
    int s, const std::string& variable, int p, int64_t elements,
    const std::function<std::string(int)>& name) {
  const auto& vars = placement_.variables();
  const VariablePlacement* vp = placement_.Find(variable);
  const size_t v = vp == nullptr ? 0 : static_cast<size_t>(vp - vars.data());
  if (vp == nullptr || p < 0 || p >= static_cast<int>(vp->partitions.size()) ||
      vp->partitions[p].server != s || seen_[v][p]) {
    return absl::DataLossError(
        absl::StrCat(name(s), " sent unexpected partition ", variable, "/", p));
  }
  const Partition& part = vp->partitions[p];
  if (elements != part.num_rows() * vp->spec.row_elements()) {
    return absl::DataLossError(
        absl::StrCat(name(s), " sent ", variable, "/", p, " with the wrong dtype or shape"));
  }
  seen_[v][p] = 1;
  ++received_;
  return Part{v, &part};
}

absl::Status PullAssembly::Complete() const {
  if (received_ != expected_) {
    return absl::DataLossError(
        absl::StrCat("pull assembled ", received_, " of ", expected_, " partitions"));
  }
  return absl::OkStatus();
}

PushReplies::PushReplies(int num_servers)
    : outcomes_(num_servers, DROPPED_STALE),
      seen_(num_servers, 0),
      versions_(num_servers, -1),
      own_pushes_(num_servers, -1) {}

void PushReplies::Add(int s, const PushResponse& reply) {
  auto rank = [](PushOutcome o) {
    switch (o) {
      case APPLIED: return 3;
      case ACCUMULATED: return 2;
      case FINISHED: return 1;
      case HELD: return -1;
      default: return 0;
    }
  };
  versions_[s] = std::max(versions_[s], reply.version());
  if (reply.outcome() == APPLIED && reply.own_pushes() > 0) own_pushes_[s] = reply.own_pushes();
  if (!seen_[s] || rank(reply.outcome()) > rank(outcomes_[s])) outcomes_[s] = reply.outcome();
  seen_[s] = 1;
}

absl::Status PushReplies::Outcomes(const std::function<std::string(int)>& name,
                                   std::vector<PushOutcome>* outcomes) const {
  for (size_t s = 0; s < outcomes_.size(); ++s) {
    if (outcomes_[s] == HELD) {
      return absl::AbortedError(absl::StrCat("Push to ", name(static_cast<int>(s)),
                                             ": the server counted none of the push's parts "
                                             "as completing it (it dropped the push)"));
    }
  }
  *outcomes = outcomes_;
  return absl::OkStatus();
}

}  // namespace pstrain
