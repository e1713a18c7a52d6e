#include "hetpar/core/file_io.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace hetpar {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::io_error(fmt::format("{}: cannot open file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error(fmt::format("{}: read failed", path));
  return ss.str();
}

Status write_file_atomically(const std::string& path, std::string_view content) {
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::io_error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
  bool good = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  good = (std::fclose(f) == 0) && good;
  if (!good || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return Status::io_error(fmt::format("{}: write failed: {}", path, std::strerror(err)));
  }
  return Status::ok();
}

}  // namespace hetpar
