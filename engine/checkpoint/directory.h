// Checkpoint directory: what lies in <dir> besides the files' contents. It owns the tag names
// (ValidateTag, DefaultTag), the names of the files in a tag directory (RankFileName,
// kMetadataFileName), <dir>/latest (WriteLatest, ReadLatest, ResolveTag) and the staging and swap
// that make a save appear whole or not at all (CreateStagingRoot, InstallStagedTag,
// CleanStaleSaves). It never reads or writes a rank file's or metadata.json's contents
// (checkpoint_rank_file.h and checkpoint_metadata.h do); it only checks that a tag's metadata.json
// exists. Thread-safe: no shared state. Files are read, written, renamed and synced through the
// FileSystem each function takes (`fs`, null: the POSIX one; runtime/file_system.h), which also
// hears the crash points below; the layout is in checkpoint_format.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

inline constexpr const char* kLatestFileName = "latest";
inline constexpr const char* kMetadataFileName = "metadata.json";
// <dir>/.zero_save.<pid>.<random>/: one save's staging directory (see "Staging" below). Tags may
// not start with this prefix.
inline constexpr const char* kStagingPrefix = ".zero_save.";

// --- names --------------------------------------------------------------------------------------
// Tags name a directory: non-empty, at most 255 bytes, no '/', no whitespace or control
// characters, not "." or "..", not starting with kStagingPrefix.
Status ValidateTag(const std::string& tag);
std::string RankFileName(int rank);  // "zero_rank_<r>_optim_states.bin"
std::string TagDirectory(const std::string& dir, const std::string& tag);
// DeepSpeed's default tag: "global_step<N>".
std::string DefaultTag(int64_t global_steps);

// --- latest -------------------------------------------------------------------------------------
// Writes <dir>/latest = tag, atomically. Call only after the tag's metadata.json exists.
Status WriteLatest(const std::string& dir, const std::string& tag, FileSystem* fs = nullptr);
// The tag in <dir>/latest (whitespace trimmed), checked to name a tag whose metadata.json exists.
// When it does not, the NOT_FOUND error names the previous copy an interrupted swap left, if any.
Result<std::string> ReadLatest(const std::string& dir, FileSystem* fs = nullptr);
// `tag` itself when not empty (checked with ValidateTag), else ReadLatest(dir).
Result<std::string> ResolveTag(const std::string& dir, const std::string& tag, FileSystem* fs = nullptr);

// --- staging and the swap (what SaveCheckpoint in checkpoint.h runs) ---------------------------
// A save writes the whole tag into a staging directory and swaps it in only when complete:
//   root = CreateStagingRoot(dir, tag)        <dir>/.zero_save.<pid>.<random>/ (+ saving_tag file)
//   WriteRankFile(root, tag, r, ...)          every rank, into <root>/<tag>/
//   WriteCheckpointMetadata(root, tag, meta)  rank 0: <root>/<tag>/metadata.json
//   InstallStagedTag(root, dir, tag)          rank 0: <root>/<tag> becomes <dir>/<tag>
//   WriteLatest(dir, tag); RemoveTree(root)   rank 0 (the root then holds the old copy, if any)
// Crash points (FileSystem::CrashPoint, where a test's FaultyFileSystem can end the process):
// "writing_rank_file" (rank r, its file half written), "rank_files_written", "metadata_written",
// "swapped", "latest_written" (rank 0), and "fallback_old_moved_away" (inside the rename fallback
// below).
//
// Makes the staging directory (and `dir`). The tag must be valid.
Result<std::string> CreateStagingRoot(const std::string& dir, const std::string& tag, FileSystem* fs = nullptr);
// Moves <root>/<tag> to <dir>/<tag>. When <dir>/<tag> exists, the two are exchanged atomically
// (FileSystem::Exchange), so the tag's name always holds a complete checkpoint and the old copy
// ends in the staging root. Where the filesystem cannot exchange (UNIMPLEMENTED), two renames: the old copy
// to <root>/previous, then the new one in (a crash between them leaves <dir>/<tag> missing, the
// old copy intact; CleanStaleSaves moves it back). fsyncs both directories.
Status InstallStagedTag(const std::string& staging_root, const std::string& dir, const std::string& tag,
                        FileSystem* fs = nullptr);
// Removes every staging directory in `dir` (left by saves that crashed or failed), first moving
// back a previous copy that an interrupted fallback swap left there when its tag is missing.
// Returns what it did ("removed <path>", "restored <tag dir> from <path>"). Call only when no
// other save into `dir` runs (one job per checkpoint directory).
Result<std::vector<std::string>> CleanStaleSaves(const std::string& dir, FileSystem* fs = nullptr);

}  // namespace zero
