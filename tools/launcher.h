// Launcher: starts N ranks of a program on this machine as child processes with the rendezvous
// variables set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), waits for
// them, and stops the others as soon as one fails (so a crashed rank never leaves the job hanging).
// Each job gets a secret for its rendezvous store (ZERO_JOB_SECRET, docs/comm.md): the launcher's own
// ZERO_JOB_SECRET if set, else 32 fresh bytes from /dev/urandom as hex. Used by `tools/launch` and
// `zero_train --nproc N`. Owns the child processes it starts: they are
// killed (SIGTERM, then SIGKILL after a grace period) if the launcher returns early, and the kernel
// kills them (PR_SET_PDEATHSIG, SIGKILL) when the thread that called LaunchLocal dies, however it
// dies. Only the ranks themselves: processes a rank starts are its own to end.
//
// A SIGINT or SIGTERM to the launcher while its ranks run is forwarded to every rank (the Trainer's
// ranks then stop gracefully: train/trainer.h), announced on stderr ("launch: got SIGTERM:
// forwarding it to the N ranks ..."), and the launcher waits for every rank, cutting none short
// even when one exits non-zero; LaunchLocal then returns UNAVAILABLE "launch: stopped by SIGTERM"
// with each rank's end. A second signal kills the ranks at once. The handlers are the launcher's
// only while LaunchLocal runs (the previous ones are restored); call it from one thread at a time.
#pragma once

#include <string>
#include <vector>

#include "runtime/status.h"

namespace zero {

struct LaunchOptions {
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                 // 0: pick a free port
  int grace_seconds = 5;               // after one rank fails, how long the others get before SIGKILL
  std::vector<std::string> extra_env;  // "KEY=VALUE" added to every child
  // The ranks' ZERO_JOB_SECRET; empty: the launcher's ZERO_JOB_SECRET, else GenerateJobSecret().
  std::string job_secret;
};

// 32 bytes from /dev/urandom as 64 lower-case hex digits.
Result<std::string> GenerateJobSecret();

// Runs argv (argv[0] is the program path) as nproc ranks. OK when every rank exits 0; otherwise an
// error naming the first rank that failed and its exit status ("(its error is above)") or signal
// ("it was killed and printed no error of its own").
Status LaunchLocal(const std::vector<std::string>& argv, const LaunchOptions& options);

// This program again (/proc/self/exe, else argv[0]) with argv[1..argc), as options.nproc ranks:
// LaunchLocal after flushing stdout (what a trainer that launches its own ranks does).
Status LaunchSelf(int argc, char** argv, const LaunchOptions& options);

// True in a process started as a rank: RANK (torchrun, LaunchLocal), OMPI_COMM_WORLD_RANK (mpirun)
// or SLURM_PROCID (srun) is set.
bool UnderLauncher();

// A free TCP port on 127.0.0.1 (bind to port 0 and read it back).
Result<int> PickFreePort();

}  // namespace zero
