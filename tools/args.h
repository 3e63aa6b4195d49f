// Flags of a `pstrain` subcommand: --name=value or --name value, each name
// declared with a default; an undeclared flag or a missing value is an error
// naming it. Single-threaded use.
#ifndef PSTRAIN_TOOLS_ARGS_H_
#define PSTRAIN_TOOLS_ARGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

class Args {
 public:
  // `flags`: name -> (default value, help).
  using FlagSpec = std::map<std::string, std::pair<std::string, std::string>>;
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv, const FlagSpec& flags);

  const std::string& Get(const std::string& name) const { return values_.at(name); }
  absl::StatusOr<int64_t> GetInt(const std::string& name) const;
  absl::StatusOr<double> GetDouble(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  static std::string Usage(const FlagSpec& flags);

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_ARGS_H_
