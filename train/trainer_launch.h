// The process side both training jobs share (zero_llm, zero_train): the launching process's last
// part (run the one rank here, or start the ranks of this binary and wait for them), a rank's exit
// line, the rank and world size a launcher set, the GPUs visible, and `bazel run`'s working
// directory. The training itself is the Trainer's (train/trainer.h). Functions of the process's
// environment; call them from the main thread.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>

#include "runtime/status.h"

namespace zero::train {

// A rank and its world size, for the rank's error line; -1: not known.
struct RankContext {
  int rank = 0;
  int world = 1;
};

// The rank and world size as the launcher set them (RANK / OMPI_COMM_WORLD_RANK / SLURM_PROCID and
// the matching sizes), read before RendezvousFromEnv (which may refuse the environment, e.g. a
// short ZERO_JOB_SECRET), so that each rank's error names its own rank instead of "rank 0 of 1".
// -1: not set, or not a number.
RankContext RankFromEnv();
// "rank R of W", "?" for an unknown number.
std::string RankName(const RankContext& c);

// The CUDA devices cudaGetDeviceCount reports; 0 when it fails or without the CUDA toolkit.
int VisibleGpus();

// One rank's work (Trainer::Run); it sets *where as soon as it knows the rank.
using RankMain = std::function<Status(RankContext* where)>;

// In the launching process, after the flags and config are checked: with nproc 1 runs the rank in
// this process (a world of one needs no rendezvous), otherwise starts nproc ranks of this binary
// (tools/launcher.h) and waits for them. Returns the exit status: 0, or 1 after printing
// "<program>: <error>" on stderr.
int RunOrLaunchRanks(const std::string& program, int nproc, int argc, char** argv, const RankMain& run_rank);

// In a process a launcher started as one rank: runs it; on an error prints
// "<program>: rank R of W: <error>" on stderr and returns 1.
int RunLaunchedRank(const std::string& program, const RankMain& run_rank);

// `bazel run` starts the binary in its runfiles tree; relative paths the user typed are relative to
// the directory bazel was run from (BUILD_WORKING_DIRECTORY). Makes each non-empty relative path of
// `paths` absolute against it; nothing outside `bazel run`.
void ResolveUserPaths(std::initializer_list<std::string*> paths);

}  // namespace zero::train
