// The output writer (see output.hpp).
#include "harness/output.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "harness/check.hpp"

namespace hr {
namespace {

namespace fs = std::filesystem;

std::string folder_of(const std::string& p) {
  const fs::path parent = fs::path(p).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Follows symbolic links to the final path: one that exists and is no link, or
// one that does not exist yet (a dangling link's target). *st is filled when it
// exists; returns false when it does not.
bool resolve(const std::string& path, std::string* out, struct stat* st) {
  constexpr int kMaxLinks = 40;  // as the kernel's own limit on a path walk
  std::string cur = path;
  for (int hop = 0; hop <= kMaxLinks; ++hop) {
    if (::lstat(cur.c_str(), st) != 0) {
      const int err = errno;
      if (err == ENOENT) {
        *out = cur;
        return false;
      }
      throw InvalidArgument(fmt::format("cannot write {}: {}", path, std::strerror(err)));
    }
    if (!S_ISLNK(st->st_mode)) {
      *out = cur;
      return true;
    }
    std::vector<char> buf(static_cast<size_t>(st->st_size > 0 ? st->st_size : 255) + 1);
    const ssize_t n = ::readlink(cur.c_str(), buf.data(), buf.size());
    if (n < 0) throw InvalidArgument(fmt::format("cannot write {}: reading the link {}: {}", path, cur,
                                                 std::strerror(errno)));
    const fs::path next(std::string(buf.data(), static_cast<size_t>(n)));
    cur = next.is_absolute() ? next.string() : (fs::path(folder_of(cur)) / next).string();
  }
  throw InvalidArgument(fmt::format("cannot write {}: its symbolic links loop (more than {} in a row)", path,
                                    kMaxLinks));
}

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a file headroom writes";
}

}  // namespace

OutputFile::OutputFile(const std::string& path) : path_(path) {
  HR_ARG_CHECK(!path.empty(), "an output path is empty");
  struct stat st {};
  const bool exists = resolve(path, &target_, &st);
  const std::string shown = target_ == path_ ? path_ : fmt::format("{} (a link to {})", path_, target_);
  if (exists && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    // Written into, never replaced: /dev/null stays a device, a pipe stays a pipe.
    direct_ = true;
    const bool fifo = S_ISFIFO(st.st_mode);
    fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY | (fifo ? O_NONBLOCK : 0));
    if (fd_ < 0) {
      const int err = errno;
      if (fifo && err == ENXIO)
        throw InvalidArgument(fmt::format("cannot write {}: a FIFO that no process reads", shown));
      throw InvalidArgument(fmt::format("cannot write {}: {}", shown, std::strerror(err)));
    }
    if (fifo) ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    return;
  }
  if (exists && !S_ISREG(st.st_mode))
    throw InvalidArgument(fmt::format("cannot write {}: it is {}; give a file path", shown, kind_of(st.st_mode)));
  if (exists) {
    mode_ = st.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode_ = 0666 & ~mask;
  }
  const std::string dir = folder_of(target_);
  std::string tmpl = (fs::path(dir) / ("." + fs::path(target_).filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  fd_ = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0)
    throw Error(fmt::format("cannot write {}: creating a temporary file in {} failed: {}", shown, dir,
                            std::strerror(errno)));
  tmp_ = name.data();
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::fail(const char* step, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  const std::string shown = target_ == path_ ? path_ : fmt::format("{} (a link to {})", path_, target_);
  throw Error(fmt::format("cannot write {}: {} failed: {}", shown, step, std::strerror(err)));
}

void OutputFile::write(const void* data, size_t bytes) {
  HR_CHECK(fd_ >= 0 && !committed_, "OutputFile::write after commit or failure");
  // A FIFO whose reader went away answers EPIPE, and raises SIGPIPE, which would
  // end the process without a word: blocked while writing, and a pending one taken.
  sigset_t pipe_only, before;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  if (direct_) ::pthread_sigmask(SIG_BLOCK, &pipe_only, &before);
  const char* p = static_cast<const char*>(data);
  int err = 0;
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  if (direct_) {
    if (err == EPIPE) {
      const struct timespec now {0, 0};
      (void)::sigtimedwait(&pipe_only, nullptr, &now);
    }
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  }
  if (err != 0) fail("write", err);
}

void OutputFile::commit() {
  HR_CHECK(fd_ >= 0 && !committed_, "OutputFile::commit twice or after a failure");
  if (direct_) {
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) fail("close", errno);
    committed_ = true;
    return;
  }
  if (::fsync(fd_) != 0) fail("fsync", errno);
  if (::fchmod(fd_, static_cast<mode_t>(mode_)) != 0) fail("chmod", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("close", errno);
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail("rename", errno);
  committed_ = true;
  // The rename itself reaches the disk with the folder's entry.
  const int dir = ::open(folder_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

void write_output(const std::string& path, const std::string& content) {
  OutputFile f(path);
  f.write(content);
  f.commit();
}

}  // namespace hr
