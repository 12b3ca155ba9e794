// Test helpers for checkpoint tests: scratch directory paths and synthetic training states saved with
// the real write protocol (every rank's file, then FinalizeCheckpoint), built with the engine's
// padding math. Test-only.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/checkpoint/format.h"
#include "engine/checkpoint/io.h"
#include "gtest/gtest.h"
#include "testing/same_bits.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero::testing {

// The path of a fresh directory, unique per call, left on disk: testing/scratch_dir.h's
// CreateWithDirectIo (some of these tests put NVMe swap files in it) for the tests that pass a path
// around (zero_llm's too). New tests hold a ::zero::ScratchDir, which removes its directory.
inline std::string ScratchDir(const std::string& name) {
  Result<::zero::ScratchDir> dir = ::zero::ScratchDir::CreateWithDirectIo(name);
  EXPECT_OK(dir);
  if (!dir.ok()) return "/nonexistent/" + name;
  dir->Keep();
  return dir->path();
}

// Odd sizes on purpose: padding at every world size > 1, a scalar and an empty parameter.
inline std::vector<ParamSignature> SyntheticModel() {
  return {
      {"embed.weight", {7, 5}}, {"block0.fc.weight", {11, 13}}, {"block0.fc.bias", {11}},
      {"block0.scale", {}},     {"block1.empty", {0, 4}},       {"head.weight", {3, 17}},
  };
}

inline std::string ModuleOf(const std::string& name) { return name.substr(0, name.find('.')); }

// Distinct values per (parameter, element, state) that survive fp32 exactly.
inline float SyntheticValue(size_t param, int64_t element, int state) {
  return static_cast<float>(param + 1) * 1000.0f + static_cast<float>(element) + 0.25f * static_cast<float>(state) -
         0.5f;
}

inline FullState SyntheticState(const std::vector<ParamSignature>& model, int world) {
  FullState full;
  CheckpointMeta& m = full.meta;
  m.global_steps = 120;
  m.skipped_steps = 3;
  m.micro_steps = 480;
  m.adam_step = 117;
  m.loss_scaler = {true, 2048.0, 37, 1, 83};
  m.scheduler = {"WarmupLR", 117, 3.125e-4};
  m.model_dtype = DType::kBF16;
  m.zero_stage = 2;
  m.dp_world_size = world;
  m.config_json = R"({"train_batch_size":32,"zero_optimization":{"stage":2}})";
  m.client_state_json = R"({"epoch":4,"note":"synthetic"})";
  for (size_t i = 0; i < model.size(); ++i) {
    m.params.push_back(MakeCheckpointParam(model[i].name, model[i].shape, ModuleOf(model[i].name), world));
    FullParam p;
    p.name = model[i].name;
    p.shape = model[i].shape;
    p.module = ModuleOf(p.name);
    p.numel = m.params.back().numel;
    for (int64_t e = 0; e < p.numel; ++e) {
      p.master.push_back(SyntheticValue(i, e, 0));
      p.exp_avg.push_back(SyntheticValue(i, e, 1));
      p.exp_avg_sq.push_back(SyntheticValue(i, e, 2));
    }
    full.params.push_back(std::move(p));
  }
  return full;
}

// Saves `full` at `world` ranks under dir/tag with the write protocol.
inline void SaveSynthetic(const std::string& dir, const std::string& tag, const FullState& full, int world) {
  for (int r = 0; r < world; ++r) {
    auto info = WriteRankFile(dir, tag, r, world, ShardFor(full, r, world));
    ASSERT_OK(info);
  }
  CheckpointMeta meta = full.meta;
  meta.dp_world_size = world;
  meta.params.clear();
  meta.rank_files.clear();  // FinalizeCheckpoint reads them from the files just written
  for (const FullParam& p : full.params) {
    meta.params.push_back(MakeCheckpointParam(p.name, p.shape, p.module, world));
  }
  Status st = FinalizeCheckpoint(dir, tag, meta);
  ASSERT_OK(st);
}

// Runs `fn` in a fork()ed child and returns the text it returned; "(hung)" when it did not finish
// within `seconds` (the child is killed), "(signal N)" when it died of a signal. A hang or a crash
// must fail the test, not block or end it.
inline std::string InChild(const std::function<std::string()>& fn, double seconds) {
  int fds[2];
  if (::pipe(fds) != 0) return "(pipe failed)";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string out = fn();
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(fds[0]);
      return "(hung)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (WIFSIGNALED(status)) return "(signal " + std::to_string(WTERMSIG(status)) + ")";
  return out;
}

// Another job holding `dir`'s DirectoryLock: a fork()ed child that takes the lock and keeps it until
// Release(). Start() returns once the child holds it; call it under ASSERT_NO_FATAL_FAILURE.
struct ChildHoldingLock {
  pid_t pid = -1;
  int release_fd = -1;

  void Start(const std::string& dir) {
    int ready[2], done[2];
    ASSERT_EQ(::pipe(ready), 0);
    ASSERT_EQ(::pipe(done), 0);
    pid = ::fork();
    if (pid == 0) {
      auto lock = DirectoryLock::Acquire(dir);
      const char c = lock.ok() ? '1' : '0';
      if (::write(ready[1], &c, 1) != 1) ::_exit(2);
      char x;
      if (::read(done[0], &x, 1) < 0) ::_exit(3);
      ::_exit(0);
    }
    release_fd = done[1];
    char c = 0;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ASSERT_EQ(c, '1');
  }

  // Lets the child exit (dropping the lock) and waits for it.
  void Release() {
    ASSERT_EQ(::write(release_fd, "x", 1), 1);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
};

}  // namespace zero::testing
