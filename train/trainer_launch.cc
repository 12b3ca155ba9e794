#include "train/trainer_launch.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "tools/launcher.h"

#if defined(ZERO_EXAMPLES_HAS_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace zero::train {

RankContext RankFromEnv() {
  auto first = [](std::initializer_list<const char*> names) -> int {
    for (const char* n : names) {
      const char* v = std::getenv(n);
      if (v == nullptr || *v == '\0') continue;
      char* end = nullptr;
      errno = 0;
      const long x = std::strtol(v, &end, 10);
      return *end == '\0' && errno == 0 && x >= 0 && x <= INT_MAX ? static_cast<int>(x) : -1;
    }
    return -1;
  };
  return RankContext{first({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}),
                     first({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"})};
}

std::string RankName(const RankContext& c) {
  auto n = [](int v) { return v < 0 ? std::string("?") : std::to_string(v); };
  return "rank " + n(c.rank) + " of " + n(c.world);
}

int VisibleGpus() {
#if defined(ZERO_EXAMPLES_HAS_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

int RunOrLaunchRanks(const std::string& program, int nproc, int argc, char** argv, const RankMain& run_rank) {
  if (nproc == 1) {
    RankContext ctx;
    Status st = run_rank(&ctx);
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s\n", program.c_str(), st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  LaunchOptions lo;
  lo.nproc = nproc;
  Status st = LaunchSelf(argc, argv, lo);
  if (!st.ok()) {
    // The launcher's message says where the rank's reason is (above, or none: killed by a signal).
    std::fprintf(stderr, "%s: %s\n", program.c_str(), st.ToString().c_str());
    return 1;
  }
  return 0;
}

int RunLaunchedRank(const std::string& program, const RankMain& run_rank) {
  RankContext ctx = RankFromEnv();
  Status st = run_rank(&ctx);
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", program.c_str(), RankName(ctx).c_str(), st.ToString().c_str());
    return 1;
  }
  return 0;
}

void ResolveUserPaths(std::initializer_list<std::string*> paths) {
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (wd == nullptr || *wd == '\0') return;
  for (std::string* p : paths) {
    if (!p->empty() && (*p)[0] != '/') *p = std::string(wd) + "/" + *p;
  }
}

}  // namespace zero::train
