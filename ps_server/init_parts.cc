#include "ps_server/init_parts.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<bool> InitParts::Add(const InitializeRequest& request,
                                    std::shared_ptr<ServerModel>* model) {
  const int num_parts = request.num_parts();
  Pending* pending = pending_.get();
  if (pending == nullptr || pending->incarnation != request.incarnation() ||
      pending->fingerprint != request.config_fingerprint() ||
      pending->num_workers != request.num_workers() ||
      pending->start_step != request.start_step() ||
      static_cast<int>(pending->got.size()) != num_parts) {
    // A new run's first part (an unfinished earlier gathering is dropped).
    pending_ = std::make_unique<Pending>();
    pending = pending_.get();
    pending->incarnation = request.incarnation();
    pending->fingerprint = request.config_fingerprint();
    pending->num_workers = request.num_workers();
    pending->start_step = request.start_step();
    pending->got.assign(num_parts, 0);
  }
  if (pending->got[request.part()]) return false;  // a retried part
  if (pending->model == nullptr) {
    pending->model = std::move(*model);  // the first part's settings and partitions
  } else {
    for (const auto& [key, p] : (*model)->partitions) {
      if (pending->model->partitions.count(key) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("Initialize: ", PartitionKeyString(key), " in two parts"));
      }
    }
    for (auto& [key, p] : (*model)->partitions) {
      pending->model->partitions.emplace(key, std::move(p));
    }
  }
  pending->got[request.part()] = 1;
  if (std::count(pending->got.begin(), pending->got.end(), 1) < num_parts) {
    return false;
  }
  *model = std::move(pending->model);
  pending_.reset();
  return true;
}

}  // namespace pstrain
