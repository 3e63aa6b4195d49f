// What config.cc and model_config.cc share: the error naming a config's field.
// Internal to common/cluster's config library.
#ifndef PSTRAIN_COMMON_CLUSTER_CONFIG_INTERNAL_H_
#define PSTRAIN_COMMON_CLUSTER_CONFIG_INTERNAL_H_

#include <string>

#include "absl/status/status.h"

namespace pstrain::config_internal {

// INVALID_ARGUMENT: "training config <source>: field <field>: <what>".
absl::Status FieldError(const std::string& source, const std::string& field,
                        const std::string& what);

}  // namespace pstrain::config_internal

#endif  // PSTRAIN_COMMON_CLUSTER_CONFIG_INTERNAL_H_
