// Free ports on loopback, and a cluster spec of local tasks on them: for
// `pstrain bench` and the multi-process tests, which start real daemons on
// 127.0.0.1.
#ifndef PSTRAIN_TOOLS_LOCAL_PORTS_H_
#define PSTRAIN_TOOLS_LOCAL_PORTS_H_

#include <string>
#include <vector>

namespace pstrain {

// `n` distinct free loopback ports, below the kernel's ephemeral range (so
// that no daemon's ":0" port or outgoing connection can take one before its
// daemon binds it): every socket stays bound until all are chosen, so the
// same port is not handed out twice. A port that could not be had is 0.
std::vector<int> PickFreePorts(int n);

// A cluster spec (JSON) with 1 chief, `ps` servers and `workers` workers on
// free loopback ports; with `metrics`, each task also gets a free port for
// /metrics in the "pstrain" extras.
std::string LocalClusterSpecJson(int ps, int workers, bool metrics = false);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_LOCAL_PORTS_H_
