// The pictures `pstrain bench` and `pstrain sweep` draw beside their CSV
// files, with a matplotlib script the binary carries as a string and Debian's
// /usr/bin/python3 (tools/setup.sh installs python3-matplotlib). The CSV is
// the result; the picture is a convenience, so a missing Python or
// matplotlib is said, not an error.
#ifndef PSTRAIN_TOOLS_PYTHON_PLOT_H_
#define PSTRAIN_TOOLS_PYTHON_PLOT_H_

#include <string>
#include <vector>

namespace pstrain {

// Runs `script` with `args` (at most 120 s), written into `out_dir` as
// `script_name` for the run and deleted with its log after it. Returns the
// line to print: "wrote <png>", or "no <png's name>: " and why.
std::string DrawWithPython(const std::string& out_dir, const std::string& script_name,
                           const char* script, const std::vector<std::string>& args,
                           const std::string& png);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_PYTHON_PLOT_H_
