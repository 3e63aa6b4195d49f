// An Initialize sent in parts (a model larger than one message, or than a
// server's part of it): the parts of one run gathered until the last is
// in, and only then installed, so a server never serves half a model.
//
// What it owns: the run being gathered (its settings and the partitions of
// the parts in). Who calls it: ParameterServer::Initialize only, under the
// server's lock (the member is guarded by ParameterServer::mu_);
// thread-compatible.
#ifndef PSTRAIN_PS_SERVER_INIT_PARTS_H_
#define PSTRAIN_PS_SERVER_INIT_PARTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ps_service.pb.h"
#include "ps_server/server_model.h"

namespace pstrain {

class InitParts {
 public:
  // Adds part request.part() of request.num_parts() (checked by
  // NewServerModel), `*model` holding its settings and partitions
  // (NewServerModel, NewPartition). Returns true,
  // with *model the whole, once the last part is in; false until then, and
  // for a part already in (a retry, which adds nothing). A part of another
  // run (incarnation, config fingerprint, workers, start step or number of
  // parts) drops an unfinished gathering and starts anew. A partition that
  // came in an earlier part is refused, the part not counted.
  absl::StatusOr<bool> Add(const InitializeRequest& request, std::shared_ptr<ServerModel>* model);
  // Whether a gathering is under way.
  bool pending() const { return pending_ != nullptr; }

 private:
  struct Pending {
    uint64_t incarnation = 0;
    uint64_t fingerprint = 0;
    int num_workers = 0;
    int64_t start_step = 0;
    std::vector<char> got;  // per part
    std::shared_ptr<ServerModel> model;
  };
  std::unique_ptr<Pending> pending_;
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_INIT_PARTS_H_
