#include "core/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace xserv {

namespace {

[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  int err = errno;
  ErrorCode code = (err == ENOENT || err == ENOTDIR) ? ErrorCode::not_found : ErrorCode::io;
  throw_error(code, "{} '{}': {}", what, path, std::strerror(err));
}

// Closes the descriptor on every exit path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void require_regular(const struct stat& st, const std::string& path) {
  if (!S_ISREG(st.st_mode))
    throw_error(ErrorCode::io, "'{}' is not a regular file ({}); model files must be", path,
                S_ISDIR(st.st_mode)    ? "a directory"
                : S_ISFIFO(st.st_mode) ? "a FIFO"
                : S_ISCHR(st.st_mode)  ? "a character device"
                : S_ISBLK(st.st_mode)  ? "a block device"
                : S_ISSOCK(st.st_mode) ? "a socket"
                                       : "not a file");
}

// Opens a regular file for reading and returns its size. stat() first, so a device or FIFO is
// refused without being opened (opening some devices has effects); then the open itself does
// not block (O_NONBLOCK: a FIFO swapped in since the stat opens at once instead of waiting for a
// writer) and fstat() checks what was really opened. The non-blocking flag changes nothing for
// a regular file's reads or maps.
std::size_t open_regular(const std::string& path, Fd& file) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_errno("cannot open", path);
  require_regular(st, path);
  file.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (file.fd < 0) throw_errno("cannot open", path);
  if (::fstat(file.fd, &st) != 0) throw_errno("cannot stat", path);
  require_regular(st, path);
  return static_cast<std::size_t>(st.st_size);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  Fd file;
  size_ = open_regular(path, file);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd, 0);
    if (p == MAP_FAILED) {
      size_ = 0;
      throw_errno("cannot mmap", path);
    }
    data_ = static_cast<const std::uint8_t*>(p);
  }
  // The mapping keeps the file alive after the descriptor closes.
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::release_pages(const void* p, std::size_t bytes) const noexcept {
  if (!contains(p)) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const auto end = std::min(begin + bytes, reinterpret_cast<std::uintptr_t>(data_) + size_);
  const std::uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void MappedFile::reset() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

std::string read_file(const std::string& path, std::size_t max_bytes) {
  Fd file;
  const std::size_t size = open_regular(path, file);
  auto too_large = [&](std::size_t at_least) {
    throw_error(ErrorCode::format, "'{}' holds {}{} bytes, more than the {} this file may have",
                path, at_least > size ? "at least " : "", at_least, max_bytes);
  };
  if (size > max_bytes) too_large(size);
  // Read up to one byte past the cap, so a file that grew since fstat is caught too.
  std::string out(size, '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() > max_bytes) too_large(out.size());
      out.resize(std::min(max_bytes + 1, std::max<std::size_t>(out.size() * 2, 4096)));
    }
    const ssize_t n = ::read(file.fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot read", path);
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > max_bytes) too_large(got);
  out.resize(got);
  return out;
}

}  // namespace xserv
