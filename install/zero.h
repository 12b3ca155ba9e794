// zero.h: the public umbrella header of the installed library (PREFIX/include/zero/zero.h).
//
// Including it gives the stable API of docs/library.md: Config parsing, the Engine, the Device
// interface with CreateDevice ("cpu", "cuda:N"), the Communicator with its rendezvous
// (CreateCommunicator, RendezvousFromEnv) and RunThreadRanks, Status/Result, DType, and the
// ZERO_VERSION macros. tools/install.sh installs exactly the headers listed here and the ones they
// include (their #include "dir/x.h" lines rewritten to <zero/dir/x.h>), and those of
// zero_models.h (the model seam, the Llama model, Hugging Face directories); nothing else of the
// source tree is public. Needs C++20 and no third-party header.
#pragma once

#include <zero/version.h>

#include <zero/comm/communicator.h>
#include <zero/comm/rendezvous.h>
#include <zero/comm/thread_ranks.h>
#include <zero/engine/config/config.h>
#include <zero/engine/engine.h>
#include <zero/runtime/device.h>
#include <zero/runtime/dtype.h>
#include <zero/runtime/status.h>
