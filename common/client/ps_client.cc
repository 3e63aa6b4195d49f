#include "common/client/ps_client.h"

#include "common/base/status_macros.h"

namespace pstrain {

absl::Status PsClient::PullAll(const std::vector<int64_t>& min_versions, absl::Duration wait,
                               std::vector<Tensor>* params, PullResult* result) {
  const auto& vars = placement().variables();
  params->resize(vars.size());
  std::vector<float*> destinations;
  for (size_t v = 0; v < vars.size(); ++v) {
    if ((*params)[v].shape() != vars[v].spec.shape) (*params)[v] = Tensor(vars[v].spec.shape);
    destinations.push_back((*params)[v].data());
  }
  return PullInto(min_versions, wait, destinations, result);
}

absl::Status PsClient::PushFrom(const std::vector<int64_t>& steps,
                                const std::vector<const float*>& sources,
                                std::vector<PushOutcome>* outcomes) {
  ASSIGN_OR_RETURN(std::unique_ptr<Push> push, StartPush(steps, sources));
  return push->Wait(outcomes);
}

absl::Status PsClient::PushAll(const std::vector<int64_t>& steps, const std::vector<Tensor>& grads,
                               std::vector<PushOutcome>* outcomes) {
  std::vector<const float*> sources;
  for (const Tensor& t : grads) sources.push_back(t.data());
  return PushFrom(steps, sources, outcomes);
}

absl::Status PsClient::PullTables(absl::Span<const TableRows> tables, int64_t min_version,
                                  absl::Duration wait) {
  for (const TableRows& t : tables) {
    RETURN_IF_ERROR(PullRows(t.table, t.dim, t.ids, min_version, wait, t.rows));
  }
  return absl::OkStatus();
}

absl::Status PsClient::PushTables(absl::Span<const TableRows> tables,
                                  const std::vector<int64_t>& steps,
                                  std::vector<std::vector<PushOutcome>>* outcomes) {
  outcomes->resize(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    RETURN_IF_ERROR(PushRows(tables[t].table, tables[t].dim, tables[t].ids, tables[t].rows, steps,
                             &(*outcomes)[t]));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
