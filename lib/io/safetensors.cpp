#include "io/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "core/error.hpp"
#include "io/json.hpp"

namespace xserv {

namespace fs = std::filesystem;

namespace {

// A header larger than this is not a real checkpoint (HF's own reader caps it at 100 MB).
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

std::uint64_t read_u64_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::uint64_t get_uint(simdjson::dom::element e, const std::string& where) {
  std::uint64_t v = 0;
  if (e.get_uint64().get(v) != simdjson::SUCCESS)
    throw_error(ErrorCode::format, "{}: expected a non-negative integer", where);
  return v;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile(path);
  const std::size_t size = f.file_.size();
  XSERV_CHECK(size >= 8, ErrorCode::format, "{}: file of {} bytes is too short for a safetensors header",
              path, size);
  const std::uint64_t header_len = read_u64_le(f.file_.data());
  XSERV_CHECK(header_len >= 2 && header_len <= kMaxHeaderBytes && header_len <= size - 8,
              ErrorCode::format, "{}: header length {} is not possible in a file of {} bytes", path,
              header_len, size);
  const std::size_t data_start = 8 + header_len;
  const std::size_t data_size = size - data_start;

  simdjson::dom::parser parser;
  std::string_view header(reinterpret_cast<const char*>(f.file_.data() + 8), header_len);
  simdjson::dom::element root = json::parse(parser, header, path + " (header)");
  simdjson::dom::object entries;
  XSERV_CHECK(root.get_object().get(entries) == simdjson::SUCCESS, ErrorCode::format,
              "{}: header is not a JSON object", path);

  for (auto [key, value] : entries) {
    std::string name(key);
    if (name == "__metadata__") {
      simdjson::dom::object meta;
      XSERV_CHECK(value.get_object().get(meta) == simdjson::SUCCESS, ErrorCode::format,
                  "{}: __metadata__ is not an object", path);
      for (auto [mk, mv] : meta) {
        std::string_view s;
        XSERV_CHECK(mv.get_string().get(s) == simdjson::SUCCESS, ErrorCode::format,
                    "{}: __metadata__.{} is not a string", path, mk);
        f.metadata_.emplace(std::string(mk), std::string(s));
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", path, name);
    simdjson::dom::object obj;
    XSERV_CHECK(value.get_object().get(obj) == simdjson::SUCCESS, ErrorCode::format,
                "{} is not an object", where);

    std::string_view dtype_str;
    XSERV_CHECK(obj["dtype"].get_string().get(dtype_str) == simdjson::SUCCESS, ErrorCode::format,
                "{} has no dtype string", where);
    auto dtype = dtype_from_safetensors(dtype_str);
    XSERV_CHECK(dtype.has_value(), ErrorCode::format, "{} has unsupported dtype '{}'", where, dtype_str);

    simdjson::dom::array shape_arr;
    XSERV_CHECK(obj["shape"].get_array().get(shape_arr) == simdjson::SUCCESS, ErrorCode::format,
                "{} has no shape array", where);
    XSERV_CHECK(shape_arr.size() <= Shape::max_rank, ErrorCode::unsupported,
                "{} has rank {} (at most {} supported)", where, shape_arr.size(), Shape::max_rank);
    Shape shape;
    std::uint64_t numel = 1;
    for (auto d : shape_arr) {
      std::uint64_t dim = get_uint(d, where + " shape");
      XSERV_CHECK(dim <= (1ull << 40) && (dim == 0 || numel <= (1ull << 62) / dim), ErrorCode::format,
                  "{} has an impossible shape", where);
      numel *= dim;
      shape.push_back(static_cast<std::int64_t>(dim));
    }

    simdjson::dom::array offsets;
    XSERV_CHECK(obj["data_offsets"].get_array().get(offsets) == simdjson::SUCCESS && offsets.size() == 2,
                ErrorCode::format, "{} has no [begin, end] data_offsets", where);
    simdjson::dom::element e_begin, e_end;
    XSERV_CHECK(offsets.at(0).get(e_begin) == simdjson::SUCCESS &&
                    offsets.at(1).get(e_end) == simdjson::SUCCESS,
                ErrorCode::format, "{} has unreadable data_offsets", where);
    std::uint64_t begin = get_uint(e_begin, where + " data_offsets");
    std::uint64_t end = get_uint(e_end, where + " data_offsets");
    XSERV_CHECK(begin <= end && end <= data_size, ErrorCode::format,
                "{}: data_offsets [{}, {}] outside the {} data bytes", where, begin, end, data_size);
    const std::uint64_t expected = numel * dtype_size(*dtype);
    XSERV_CHECK(end - begin == expected, ErrorCode::format,
                "{}: {} bytes for shape {} of {} (expected {})", where, end - begin, shape,
                dtype_name(*dtype), expected);

    TensorInfo info;
    info.name = std::move(name);
    info.dtype = *dtype;
    info.shape = shape;
    info.offset = data_start + begin;
    info.bytes = end - begin;
    info.data = f.file_.data() + info.offset;
    f.tensors_.push_back(std::move(info));
  }

  // Ranges must not overlap (a corrupt header could alias two tensors).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    const auto* cur = by_offset[i];
    XSERV_CHECK(cur->offset >= prev->offset + prev->bytes || prev->bytes == 0 || cur->bytes == 0,
                ErrorCode::format, "{}: tensors '{}' and '{}' overlap", path, prev->name, cur->name);
  }
  // Zero-copy views are only safe when each tensor is aligned for its dtype; the writers of
  // transformers/safetensors pad the header to 8 bytes so real files always are.
  for (const auto& t : f.tensors_)
    XSERV_CHECK(t.offset % dtype_size(t.dtype) == 0, ErrorCode::format,
                "{}: tensor '{}' is not aligned to its {}-byte elements", path, t.name,
                dtype_size(t.dtype));

  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  for (std::size_t i = 1; i < f.tensors_.size(); ++i)
    XSERV_CHECK(f.tensors_[i].name != f.tensors_[i - 1].name, ErrorCode::format,
                "{}: tensor '{}' appears twice", path, f.tensors_[i].name);
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const noexcept {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

// ---- Checkpoint ---------------------------------------------------------------------------

namespace {

// Parses "<prefix>-<index>-of-<total>.safetensors"; false for any other name.
bool parse_shard_name(std::string_view name, std::string& prefix, int& index, int& total) {
  constexpr std::string_view ext = ".safetensors";
  if (!name.ends_with(ext)) return false;
  name.remove_suffix(ext.size());
  auto of = name.rfind("-of-");
  if (of == std::string_view::npos) return false;
  auto dash = name.rfind('-', of == 0 ? 0 : of - 1);
  if (dash == std::string_view::npos || dash >= of) return false;
  auto digits = [](std::string_view s, int& out) {
    if (s.empty() || s.size() > 6) return false;
    out = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    return true;
  };
  prefix = std::string(name.substr(0, dash));
  return digits(name.substr(dash + 1, of - dash - 1), index) && digits(name.substr(of + 4), total) &&
         index >= 1 && index <= total;
}

std::vector<std::string> find_shards(const std::string& dir) {
  // model-00001-of-00003.safetensors: every index 1..M of one M must be present.
  std::map<std::string, std::map<int, std::string>> groups;  // "prefix/M" -> index -> file
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string prefix;
    int index = 0, total = 0;
    if (!parse_shard_name(entry.path().filename().string(), prefix, index, total)) continue;
    groups[prefix + "/" + std::to_string(total)][index] = entry.path().string();
  }
  XSERV_CHECK(groups.size() <= 1, ErrorCode::format, "{}: several sets of sharded safetensors", dir);
  std::vector<std::string> files;
  if (groups.empty()) return files;
  const auto& [key, shards] = *groups.begin();
  int total = std::stoi(key.substr(key.rfind('/') + 1));
  for (int i = 1; i <= total; ++i) {
    auto it = shards.find(i);
    XSERV_CHECK(it != shards.end(), ErrorCode::not_found, "{}: shard {} of {} is missing", dir, i,
                total);
    files.push_back(it->second);
  }
  return files;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint ck;
  std::error_code ec;
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // from the index, when there is one

  if (fs::is_regular_file(path, ec)) {
    ck.dir_ = fs::path(path).parent_path().string();
    files.push_back(path);
  } else {
    XSERV_CHECK(fs::is_directory(path, ec), ErrorCode::not_found, "model directory '{}' does not exist", path);
    ck.dir_ = path;
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    const fs::path single = fs::path(path) / "model.safetensors";
    if (fs::exists(index, ec)) {
      std::string text = read_file(index.string());
      simdjson::dom::parser parser;
      auto root = json::parse(parser, text, index.string());
      simdjson::dom::object map;
      XSERV_CHECK(root["weight_map"].get_object().get(map) == simdjson::SUCCESS, ErrorCode::format,
                  "{}: no weight_map object", index.string());
      std::set<std::string> unique;
      for (auto [name, file] : map) {
        std::string_view f;
        XSERV_CHECK(file.get_string().get(f) == simdjson::SUCCESS, ErrorCode::format,
                    "{}: weight_map.{} is not a file name", index.string(), name);
        XSERV_CHECK(f.find('/') == std::string_view::npos && f.find("..") == std::string_view::npos,
                    ErrorCode::format, "{}: shard name '{}' leaves the directory", index.string(), f);
        weight_map.emplace(std::string(name), std::string(f));
        unique.emplace(f);
      }
      for (const auto& f : unique) files.push_back((fs::path(path) / f).string());
    } else if (fs::exists(single, ec)) {
      files.push_back(single.string());
    } else {
      files = find_shards(path);
    }
    XSERV_CHECK(!files.empty(), ErrorCode::not_found, "'{}' holds no model.safetensors", path);
  }

  for (const auto& file : files) {
    XSERV_CHECK(fs::exists(file, ec), ErrorCode::not_found, "checkpoint shard '{}' is missing",
                file);
    ck.files_.push_back(std::make_shared<SafetensorsFile>(SafetensorsFile::open(file)));
  }
  for (const auto& f : ck.files_) {
    for (const auto& t : f->tensors()) {
      auto [it, inserted] = ck.index_.emplace(t.name, &t);
      XSERV_CHECK(inserted, ErrorCode::format, "tensor '{}' is in both '{}' and another shard of '{}'",
                  t.name, f->path(), path);
    }
  }
  for (const auto& [name, file] : weight_map) {
    auto it = ck.index_.find(name);
    XSERV_CHECK(it != ck.index_.end(), ErrorCode::format,
                "the index of '{}' names tensor '{}' in '{}', which does not hold it", path, name, file);
  }
  return ck;
}

const TensorInfo* Checkpoint::find(const std::string& name) const noexcept {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

void Checkpoint::release(const TensorInfo& tensor) const noexcept {
  for (const auto& f : files_)
    if (f->mapping().contains(tensor.data)) f->mapping().release_pages(tensor.data, tensor.bytes);
}

Tensor Checkpoint::view(const std::string& name) const {
  const TensorInfo* t = find(name);
  XSERV_CHECK(t != nullptr, ErrorCode::not_found, "tensor '{}' not found in checkpoint '{}'", name, dir_);
  return Tensor(const_cast<std::uint8_t*>(t->data), t->dtype, t->shape);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, _] : index_) out.push_back(name);
  return out;
}

std::size_t Checkpoint::total_bytes() const noexcept {
  std::size_t n = 0;
  for (const auto& [_, t] : index_) n += t->bytes;
  return n;
}

}  // namespace xserv
