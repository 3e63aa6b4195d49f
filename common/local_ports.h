// Free ports on loopback, and a cluster spec of local tasks on them: for
// `pstrain bench` and the multi-process tests, which start real daemons on
// 127.0.0.1.
#ifndef PSTRAIN_COMMON_LOCAL_PORTS_H_
#define PSTRAIN_COMMON_LOCAL_PORTS_H_

#include <string>
#include <vector>

namespace pstrain {

// `n` distinct free loopback ports: every socket stays bound until all are
// chosen, so the kernel cannot hand the same port out twice. A port that
// could not be had is 0.
std::vector<int> PickFreePorts(int n);

// A cluster spec (JSON) with 1 chief, `ps` servers and `workers` workers on
// free loopback ports; with `metrics`, each task also gets a free port for
// /metrics in the "pstrain" extras.
std::string LocalClusterSpecJson(int ps, int workers, bool metrics = false);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_LOCAL_PORTS_H_
