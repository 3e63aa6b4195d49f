#include "tools/python_plot.h"

#include <unistd.h>

#include <optional>

#include "absl/time/time.h"
#include "common/storage/env.h"
#include "tools/subprocess.h"

namespace pstrain {

std::string DrawWithPython(const std::string& out_dir, const std::string& script_name,
                           const char* script, const std::vector<std::string>& args,
                           const std::string& png) {
  const size_t slash = png.rfind('/');
  const std::string no = "no " + (slash == std::string::npos ? png : png.substr(slash + 1)) + ": ";
  if (::access("/usr/bin/python3", X_OK) != 0) return no + "/usr/bin/python3 not found";
  const std::string path = JoinPath(out_dir, script_name);
  if (!WriteFileAtomically(Env::Default(), path, script).ok()) return no + "cannot write " + path;
  SpawnOptions so;
  so.argv = {"/usr/bin/python3", path};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.output_file = path + ".log";
  auto proc = Subprocess::Spawn(so);
  std::optional<int> code;
  if (proc.ok()) {
    code = (*proc)->Wait(absl::Seconds(120));
    if (!code) code = (*proc)->Stop(absl::Seconds(2));
  }
  auto log = Env::Default()->ReadFile(so.output_file);
  Env::Default()->DeleteFile(path).IgnoreError();
  Env::Default()->DeleteFile(so.output_file).IgnoreError();
  if (code == 0) return "wrote " + png;
  if (log.ok() && log->find("No module named 'matplotlib'") != std::string::npos) {
    return no + "python3 lacks matplotlib (apt install python3-matplotlib)";
  }
  return no + "the plot failed" + (log.ok() ? ": " + *log : "");
}

}  // namespace pstrain
