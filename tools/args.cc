#include "tools/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv, const FlagSpec& flags) {
  Args args;
  for (const auto& [name, spec] : flags) args.values_[name] = spec.first;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", a, "\""));
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto it = flags.find(name);
    if (it == flags.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value) {
      const bool is_bool = it->second.first == "false" || it->second.first == "true";
      if (is_bool) {
        value = "true";
      } else if (i + 1 < argv.size()) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    args.values_[name] = value;
  }
  return args;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name) const {
  int64_t v;
  if (!absl::SimpleAtoi(Get(name), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected an integer, got \"",
                                                   Get(name), "\""));
  }
  return v;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name) const {
  double v;
  if (!absl::SimpleAtod(Get(name), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected a number, got \"",
                                                   Get(name), "\""));
  }
  return v;
}

bool Args::GetBool(const std::string& name) const {
  const std::string& v = Get(name);
  return v == "true" || v == "1" || v == "yes";
}

std::string Args::Usage(const FlagSpec& flags) {
  std::string out;
  for (const auto& [name, spec] : flags) {
    absl::StrAppend(&out, "  --", name, " (default \"", spec.first, "\"): ", spec.second, "\n");
  }
  return out;
}

}  // namespace pstrain
