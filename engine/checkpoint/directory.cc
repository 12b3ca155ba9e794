#include "engine/checkpoint/directory.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <random>

#include "runtime/atomic_file.h"

namespace zero {

// --- names ---------------------------------------------------------------------------------------

Status ValidateTag(const std::string& tag) {
  if (tag.empty()) return InvalidArgumentError("checkpoint tag is empty");
  if (tag.size() > 255) return InvalidArgumentError("checkpoint tag is longer than 255 bytes");
  if (tag == "." || tag == "..") return InvalidArgumentError("checkpoint tag '" + tag + "' is not a directory name");
  if (tag.rfind(kStagingPrefix, 0) == 0) {
    return InvalidArgumentError("checkpoint tag '" + tag + "' starts with '" + kStagingPrefix +
                                "', which names the save's staging directories");
  }
  for (unsigned char c : tag) {
    if (c == '/' || std::isspace(c) || std::iscntrl(c)) {
      return InvalidArgumentError("checkpoint tag '" + tag + "' contains '/', whitespace or a control character");
    }
  }
  return OkStatus();
}

std::string RankFileName(int rank) { return "zero_rank_" + std::to_string(rank) + "_optim_states.bin"; }

std::string TagDirectory(const std::string& dir, const std::string& tag) { return JoinPath(dir, tag); }

std::string DefaultTag(int64_t global_steps) { return "global_step" + std::to_string(global_steps); }

// --- staging and the swap ------------------------------------------------------------------------

namespace {
constexpr const char* kStagingTagFile = "saving_tag";
constexpr const char* kStagingPrevious = "previous";

bool IsStagingRoot(const std::string& name) { return name.rfind(kStagingPrefix, 0) == 0; }
}  // namespace

Result<std::string> CreateStagingRoot(const std::string& dir, const std::string& tag, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  ZERO_RETURN_IF_ERROR(CreateDirectories(fs, dir));
  std::random_device rd;
  for (int attempt = 0; attempt < 8; ++attempt) {
    char name[64];
    std::snprintf(name, sizeof(name), "%s%d.%08x%08x", kStagingPrefix, static_cast<int>(::getpid()), rd(), rd());
    const std::string root = JoinPath(dir, name);
    int err = 0;
    Status made = fs.CreateDirectory(root, &err);
    if (!made.ok()) {
      if (err == EEXIST) continue;
      return made;
    }
    ZERO_RETURN_IF_ERROR(WriteFileAtomic(fs, JoinPath(root, kStagingTagFile), tag));
    ZERO_RETURN_IF_ERROR(fs.SyncDirectory(dir));
    return root;
  }
  return InternalError("create a staging directory in " + dir + ": no free name after 8 attempts");
}

Status InstallStagedTag(const std::string& staging_root, const std::string& dir, const std::string& tag,
                        FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string staged = TagDirectory(staging_root, tag);
  const std::string target = TagDirectory(dir, tag);
  const std::string what = "install checkpoint " + staged + " as " + target;
  if (!PathExists(fs, target)) {
    ZERO_RETURN_IF_ERROR(fs.Rename(staged, target).WithContext(what));
  } else {
    Status st = fs.Exchange(staged, target);
    if (st.code() == StatusCode::kUnimplemented) {
      // Two renames: the old copy moves into the staging root first, so it is never destroyed;
      // a crash between them leaves `target` missing and CleanStaleSaves (or a person) moves the
      // old copy back.
      const std::string previous = JoinPath(staging_root, kStagingPrevious);
      ZERO_RETURN_IF_ERROR(fs.Rename(target, previous).WithContext(what));
      ZERO_RETURN_IF_ERROR(fs.SyncDirectory(dir));
      ZERO_RETURN_IF_ERROR(fs.SyncDirectory(staging_root));
      fs.CrashPoint("fallback_old_moved_away", 0);
      st = fs.Rename(staged, target);
      if (!st.ok()) {
        Status back = fs.Rename(previous, target);
        return st.WithContext(what + (back.ok() ? " (the previous copy was put back)"
                                                : " (putting the previous copy back failed: " + back.message() + ")"));
      }
    } else if (!st.ok()) {
      return st.WithContext(what);
    }
  }
  ZERO_RETURN_IF_ERROR(fs.SyncDirectory(dir));
  return fs.SyncDirectory(staging_root);
}

Result<std::vector<std::string>> CleanStaleSaves(const std::string& dir, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  std::vector<std::string> done;
  if (!PathExists(fs, dir)) return done;
  ZERO_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDirectory(dir));
  for (const std::string& name : names) {
    if (!IsStagingRoot(name)) continue;
    const std::string root = JoinPath(dir, name);
    const std::string previous = JoinPath(root, kStagingPrevious);
    auto tag = fs.ReadFile(JoinPath(root, kStagingTagFile));
    if (tag.ok() && ValidateTag(*tag).ok() && PathExists(fs, previous) && !PathExists(fs, TagDirectory(dir, *tag))) {
      // A save died between the two renames of the fallback swap: put the old copy back.
      ZERO_RETURN_IF_ERROR(fs.Rename(previous, TagDirectory(dir, *tag))
                               .WithContext("restore the previous copy of tag '" + *tag +
                                            "' left by an "
                                            "interrupted save"));
      ZERO_RETURN_IF_ERROR(fs.SyncDirectory(dir));
      done.push_back("restored " + TagDirectory(dir, *tag) + " from " + previous);
    }
    ZERO_RETURN_IF_ERROR(
        RemoveTree(fs, root).WithContext("remove the staging directory " + root + " left by an interrupted save"));
    done.push_back("removed " + root);
  }
  if (!done.empty()) ZERO_RETURN_IF_ERROR(fs.SyncDirectory(dir));
  return done;
}

namespace {
// Where an interrupted fallback swap left the previous copy of `tag`, or "".
std::string FindPreviousCopy(FileSystem& fs, const std::string& dir, const std::string& tag) {
  auto names = fs.ListDirectory(dir);
  if (!names.ok()) return "";
  for (const std::string& name : *names) {
    if (!IsStagingRoot(name)) continue;
    const std::string root = JoinPath(dir, name);
    auto t = fs.ReadFile(JoinPath(root, kStagingTagFile));
    const std::string previous = JoinPath(root, kStagingPrevious);
    if (t.ok() && *t == tag && PathExists(fs, JoinPath(previous, kMetadataFileName))) return previous;
  }
  return "";
}
}  // namespace

// --- latest --------------------------------------------------------------------------------------

Status WriteLatest(const std::string& dir, const std::string& tag, FileSystem* fs) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  return WriteFileAtomic(*FileSystemOrDefault(fs), JoinPath(dir, kLatestFileName), tag);
}

Result<std::string> ReadLatest(const std::string& dir, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  if (!PathExists(fs, dir)) return NotFoundError("checkpoint directory " + dir + " does not exist");
  const std::string path = JoinPath(dir, kLatestFileName);
  if (!PathExists(fs, path)) {
    return NotFoundError(path + " is missing: no checkpoint was completed in " + dir +
                         " (pass a tag explicitly to load an incomplete save's files)");
  }
  ZERO_ASSIGN_OR_RETURN(std::string text, fs.ReadFile(path));
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  std::string tag = text.substr(b, e - b);
  Status valid = ValidateTag(tag);
  if (!valid.ok()) return DataLossError(path + ": " + valid.message());
  const std::string meta_path = JoinPath(TagDirectory(dir, tag), kMetadataFileName);
  if (!PathExists(fs, meta_path)) {
    const std::string previous = FindPreviousCopy(fs, dir, tag);
    if (!previous.empty()) {
      return NotFoundError(path + " names tag '" + tag + "', but " + meta_path +
                           " does not exist: a save of that tag was interrupted while swapping "
                           "it in; the previous copy is intact at " +
                           previous + " (the next SaveCheckpoint in " + dir + " moves it back)");
    }
    return NotFoundError(path + " names tag '" + tag + "', but " + meta_path +
                         " does not exist (the tag directory was deleted or moved)");
  }
  return tag;
}

Result<std::string> ResolveTag(const std::string& dir, const std::string& tag, FileSystem* fs) {
  if (tag.empty()) return ReadLatest(dir, fs);
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  return tag;
}

}  // namespace zero
