// Checkpoint saving and loading (see checkpoint.h for the layout and the crash guarantees).
#include "train/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "core/file.h"
#include "core/safetensors.h"
#include "device/device.h"

namespace h2 {
namespace fs = std::filesystem;
namespace {

std::vector<float> to_host(const Tensor& t) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  copy_to_host(host.data(), t);
  return host;
}

// (rows, cols) -> (cols, rows): H2 keeps linear weights (out, in); Hugging Face's Conv1D keeps (in, out).
std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * cols + c)];
  }
  return out;
}

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

size_t bytes_of(const SafetensorsEntry& e) {
  size_t n = dtype_size(e.dtype);
  for (int64_t d : e.shape) n *= static_cast<size_t>(d);
  return n;
}

uint32_t crc32_of(const void* data, size_t bytes) {
  // zlib's crc32 takes at most 4 GiB a call.
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  for (size_t left = bytes; left > 0;) {
    const uInt n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = ::crc32(crc, p, n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(crc);
}

uint32_t crc_of(const SafetensorsEntry& e) { return crc32_of(e.data, bytes_of(e)); }

nlohmann::ordered_json manifest_to(const Manifest& manifest) {
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  for (const auto& [name, file] : manifest) {
    nlohmann::ordered_json crcs = nlohmann::ordered_json::object();
    for (const auto& [tensor, crc] : file.crc32) crcs[tensor] = crc;
    files[name] = {{"bytes", file.bytes}, {"crc32", crcs}};
  }
  return files;
}

// The manifest of `files` (state.json's "files"); nlohmann's exceptions for the caller to name the file.
Manifest manifest_from(const nlohmann::json& files, const std::string& where) {
  Manifest manifest;
  for (const auto& [name, f] : files.items()) {
    if (name.find('/') != std::string::npos || !name.ends_with(".safetensors")) {
      throw Error(ErrorCode::kIo, cat(where, ": the manifest names '", name, "', not a checkpoint file"));
    }
    ManifestFile m{.bytes = f.at("bytes").get<uint64_t>(), .crc32 = {}};
    for (const auto& [tensor, crc] : f.at("crc32").items()) m.crc32[tensor] = crc.get<uint32_t>();
    manifest[name] = std::move(m);
  }
  return manifest;
}

std::vector<std::string> safetensors_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string n = entry.path().filename().string();
    if (n.ends_with(".safetensors")) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A checkpoint's files as its manifest names them, each checked against it without reading its tensors: its size,
// and that its header holds the tensors the manifest lists for it. A version-1 checkpoint has no manifest: its files
// are read as they are.
std::vector<std::unique_ptr<SafetensorsFile>> open_checked(const std::string& checkpoint,
                                                           const CheckpointState& state) {
  std::vector<std::unique_ptr<SafetensorsFile>> out;
  if (state.files.empty()) {
    for (const std::string& n : safetensors_in(checkpoint)) {
      out.push_back(std::make_unique<SafetensorsFile>((fs::path(checkpoint) / n).string()));
    }
    return out;
  }
  for (const auto& [name, want] : state.files) {
    const std::string path = (fs::path(checkpoint) / name).string();
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) throw Error(ErrorCode::kIo, cat(path, ": missing (the checkpoint's manifest names it)"));
    if (size != want.bytes) {
      throw Error(ErrorCode::kIo,
                  cat(path, ": ", size, " bytes, the manifest says ", want.bytes, " (truncated or overwritten)"));
    }
    auto file = std::make_unique<SafetensorsFile>(path);
    for (const SafetensorsEntry& e : file->entries()) {
      if (want.crc32.count(e.name) == 0)
        throw Error(ErrorCode::kIo, cat(path, ": tensor '", e.name, "' is not in the manifest"));
    }
    if (file->entries().size() != want.crc32.size()) {
      throw Error(ErrorCode::kIo,
                  cat(path, ": ", file->entries().size(), " tensors, the manifest names ", want.crc32.size()));
    }
    out.push_back(std::move(file));
  }
  return out;
}

// A parameter's shape in the checkpoint's model file: Hugging Face's layout (its Conv1D matrices transposed).
std::vector<int64_t> hf_dims(const Gpt::Param& p) {
  const std::vector<int64_t> d = dims(p.full_shape);
  return p.hf_transposed ? std::vector<int64_t>{d[1], d[0]} : d;
}

// One tensor of a file open_checked returned, read through: its checksum against the manifest's, and its values
// finite. Nothing to check in a version-1 checkpoint.
void verify_tensor(const SafetensorsFile& file, const SafetensorsEntry& e, const CheckpointState& state) {
  const auto listed = state.files.find(fs::path(file.path()).filename().string());
  if (listed == state.files.end()) return;
  const std::string& path = file.path();
  const uint32_t crc = crc_of(e), saved = listed->second.crc32.at(e.name);
  if (crc != saved) {
    throw Error(ErrorCode::kIo, cat(path, ": tensor '", e.name, "' does not match its checksum (CRC-32 ", crc,
                                    ", saved ", saved, "): the file is corrupt"));
  }
  if (e.dtype == DType::kF32) {
    const auto* v = static_cast<const float*>(e.data);
    const size_t n = bytes_of(e) / 4;
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(v[i])) {
        throw Error(ErrorCode::kIo, cat(path, ": tensor '", e.name, "' holds ", v[i], " at element ", i,
                                        ": the run had diverged when it was saved"));
      }
    }
  }
}

}  // namespace

std::string manifest_json(const Manifest& manifest) { return manifest_to(manifest).dump(); }

Manifest parse_manifest(const std::string& text, const std::string& where) {
  try {
    return manifest_from(nlohmann::json::parse(text), where);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kIo, cat(where, ": malformed checkpoint manifest: ", e.what()));
  }
}

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(step));
  return name;
}

std::string begin_checkpoint(const std::string& dir, int64_t step) {
  const fs::path tmp_dir = fs::path(dir) / (checkpoint_name(step) + ".tmp");
  std::error_code ec;
  fs::create_directories(dir, ec);
  fs::remove_all(tmp_dir, ec);
  if (!fs::create_directories(tmp_dir, ec) && ec) {
    throw Error(ErrorCode::kIo, cat(tmp_dir.string(), ": cannot create the checkpoint folder: ", ec.message()));
  }
  return tmp_dir.string();
}

void for_each_saved_param(Gpt& model, const float* m, const float* v,
                          const std::function<bool(const Gpt::Param&)>& include, const ShardGather& gather,
                          const std::function<void(const SavedParam&)>& take) {
  const TensorParallel& tp = model.tp();
  const bool writer = tp.rank == 0;
  H2_CHECK(tp.size == 1 || (writer ? bool(gather.receive) : bool(gather.send)))
      << "a tensor-parallel model's checkpoint needs its shards gathered";
  int64_t offset = 0;
  for (const Gpt::Param& p : model.params()) {
    const int64_t n = p.value.numel();
    const bool split = tp.size > 1 && p.split != TpSplit::kNone;
    if ((include && !include(p)) || (!writer && !split)) {  // a replicated tensor: the writer's own copy is whole
      offset += n;
      continue;
    }
    const std::vector<float> local = to_host(p.value);
    const std::array<const float*, 3> mine{local.data(), m + offset, v + offset};
    offset += n;
    if (!writer) {
      for (const float* x : mine) {
        if (n > 0) gather.send(x, static_cast<size_t>(n));  // a vocabulary shard may be empty
      }
      continue;
    }
    // Each rank's runs of its shard put in place: the writer's, then each other rank's as it arrives.
    const Shape& s = p.full_shape;
    SavedParam saved{p.name, hf_dims(p), dims(s), {}, {}, {}};
    const std::array<std::vector<float>*, 3> whole{&saved.value, &saved.m, &saved.v};
    std::vector<float> received;
    for (size_t k = 0; k < whole.size(); ++k) {
      std::vector<float>& to = *whole[k];
      to.resize(static_cast<size_t>(s.numel()));
      const auto place = [&](int rank, const float* from) {
        tp_runs(p.split, s, rank, tp.size,
                [&](int64_t full, int64_t at, int64_t count) { std::copy_n(from + at, count, to.data() + full); });
      };
      place(tp.rank, mine[k]);
      for (int r = 1; split && r < tp.size; ++r) {
        int64_t count = 0;
        tp_runs(p.split, s, r, tp.size, [&](int64_t, int64_t, int64_t c) { count += c; });
        if (count == 0) continue;
        received.resize(static_cast<size_t>(count));
        gather.receive(r, received.data(), received.size());
        place(r, received.data());
      }
    }
    if (p.hf_transposed) saved.value = transposed(saved.value, s[0], s[1]);
    take(saved);
  }
}

Manifest write_model_files(const std::string& folder, const std::string& part, Gpt& model, const float* m,
                           const float* v, const std::function<bool(const Gpt::Param&)>& include,
                           const ShardGather& gather) {
  const bool write = model.tp().rank == 0;
  // The headers first, from the shapes alone: the tensors follow one at a time.
  std::vector<SafetensorsEntry> values, moments;
  for (const Gpt::Param& p : model.params()) {
    if (include && !include(p)) continue;
    values.push_back({p.name, DType::kF32, hf_dims(p), nullptr});
    moments.push_back({"m." + p.name, DType::kF32, dims(p.full_shape), nullptr});
    moments.push_back({"v." + p.name, DType::kF32, dims(p.full_shape), nullptr});
  }
  const std::string value_name = "model" + part + ".safetensors", moment_name = "optimizer" + part + ".safetensors";
  std::optional<SafetensorsWriter> value_file, moment_file;
  if (write) {
    value_file.emplace((fs::path(folder) / value_name).string(), values,
                       std::map<std::string, std::string>{{"format", "pt"}, {"producer", "h2"}});
    moment_file.emplace((fs::path(folder) / moment_name).string(), moments);
  }
  Manifest written;
  if (write) written[value_name], written[moment_name];  // both listed, even when `include` takes no tensor
  for_each_saved_param(model, m, v, include, gather, [&](const SavedParam& p) {
    // The checksums of the bytes as they leave memory: what the file should hold, whatever reaches the disk.
    auto out = [&](SafetensorsWriter& file, const std::string& file_name, const std::string& tensor,
                   const std::vector<float>& x) {
      written[file_name].crc32[tensor] = crc32_of(x.data(), x.size() * sizeof(float));
      file.append(x.data());
    };
    out(*value_file, value_name, p.name, p.value);
    out(*moment_file, moment_name, "m." + p.name, p.m);
    out(*moment_file, moment_name, "v." + p.name, p.v);
  });
  if (!write) return written;
  value_file->commit();
  moment_file->commit();
  for (auto& [name, file] : written) file.bytes = fs::file_size(fs::path(folder) / name);
  return written;
}

void write_checkpoint_state(const std::string& folder, const CheckpointState& state) {
  nlohmann::ordered_json json = {
      {"format", "h2-checkpoint"},
      {"version", kCheckpointVersion},
      {"step", state.step},
      {"model",
       {{"n_layer", state.model.n_layer},
        {"n_head", state.model.n_head},
        {"n_embd", state.model.n_embd},
        {"vocab_size", state.model.vocab_size},
        {"seq_len", state.model.seq_len}}},
      {"data", {{"seed", state.data_seed}, {"epoch", state.data.epoch}, {"batch", state.data.batch}}},
      {"precision", precision_name(state.precision)},
      {"weights", "f32 master copy"}};
  // The folder against the manifest, by the files' names and sizes only: reading them back would cost the
  // whole checkpoint's reading on one rank, and would bless what reached the disk rather than what was written.
  for (const auto& [name, file] : state.files) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(fs::path(folder) / name, ec);
    if (ec) throw Error(ErrorCode::kIo, cat(folder, ": ", name, " was not written (its writer listed it)"));
    if (size != file.bytes) {
      throw Error(ErrorCode::kIo, cat(folder, ": ", name, " holds ", size, " bytes, its writer wrote ", file.bytes));
    }
  }
  for (const std::string& name : safetensors_in(folder)) {
    if (state.files.count(name) == 0)
      throw Error(ErrorCode::kIo, cat(folder, ": ", name, " is in the folder but no writer listed it"));
  }
  if (state.files.empty()) throw Error(ErrorCode::kIo, cat(folder, ": no checkpoint file was written"));
  json["files"] = manifest_to(state.files);
  write_file_atomic((fs::path(folder) / "state.json").string(), json.dump(2) + "\n");
}

std::string commit_checkpoint(const std::string& dir, int64_t step, int keep, const std::string& protect) {
  const std::string name = checkpoint_name(step);
  const fs::path final_dir = fs::path(dir) / name, tmp_dir = fs::path(dir) / (name + ".tmp");
  std::error_code ec;
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec)
    throw Error(ErrorCode::kIo, cat(final_dir.string(), ": cannot move the checkpoint into place: ", ec.message()));
  write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");

  if (keep > 0) {  // drop the oldest complete checkpoints beyond `keep`
    std::vector<fs::path> all;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string n = entry.path().filename().string();
      if (entry.is_directory() && n.starts_with("step_") && !n.ends_with(".tmp")) all.push_back(entry.path());
    }
    std::sort(all.begin(), all.end());
    const std::string kept = protect.empty() ? "" : fs::path(protect).filename().string();
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
      if (all[i].filename().string() != kept) fs::remove_all(all[i], ec);
    }
  }
  return final_dir.string();
}

std::string save_checkpoint(const std::string& dir, Gpt& model, const OptimizerState& optimizer,
                            const CheckpointState& state, int keep, const std::string& protect) {
  const std::string folder = begin_checkpoint(dir, state.step);
  const std::vector<float> m = to_host(optimizer.m), v = to_host(optimizer.v);
  CheckpointState written = state;
  written.files = write_model_files(folder, "", model, m.data(), v.data(), nullptr, {});
  write_checkpoint_state(folder, written);
  return commit_checkpoint(dir, state.step, keep, protect);
}

std::string latest_checkpoint(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  if (!fs::exists(latest)) {
    throw Error(ErrorCode::kNotFound, cat(dir, ": no checkpoint to resume from (", latest.string(), " is missing)"));
  }
  std::string name = read_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return (fs::path(dir) / name).string();
}

CheckpointState read_checkpoint_state(const std::string& checkpoint) {
  const std::string path = (fs::path(checkpoint) / "state.json").string();
  CheckpointState state;
  try {
    const nlohmann::json json = nlohmann::json::parse(read_file(path));
    if (json.at("format") != "h2-checkpoint") throw Error(ErrorCode::kIo, cat(path, ": not an H2 checkpoint"));
    const int version = json.at("version").get<int>();
    if (version != 1 && version != kCheckpointVersion) {
      throw Error(ErrorCode::kIo, cat(path, ": checkpoint version ", json.at("version").dump(), " (this build reads ",
                                      kCheckpointVersion, ")"));
    }
    state.step = json.at("step").get<int64_t>();
    const auto& m = json.at("model");
    state.model = GptConfig{m.at("n_layer").get<int>(), m.at("n_head").get<int>(), m.at("n_embd").get<int>(),
                            m.at("vocab_size").get<int>(), m.at("seq_len").get<int>()};
    const auto& d = json.at("data");
    state.data_seed = d.at("seed").get<uint64_t>();
    state.data = {d.at("epoch").get<uint64_t>(), d.at("batch").get<uint64_t>()};
    if (json.contains("precision")) {
      const auto p = parse_precision(json.at("precision").get<std::string>());
      if (!p)
        throw Error(ErrorCode::kIo, cat(path, ": precision ", json.at("precision").dump(), " is not bf16 or f32"));
      state.precision = *p;
    }
    if (version >= 2) {
      state.files = manifest_from(json.at("files"), path);
      if (state.files.empty()) throw Error(ErrorCode::kIo, cat(path, ": the manifest names no file"));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kIo, cat(path, ": malformed checkpoint state: ", e.what()));
  }
  return state;
}

void check_checkpoint_model(const CheckpointState& state, const GptConfig& config, const std::string& checkpoint) {
  const GptConfig& m = state.model;
  for (auto [saved, want, name] : {std::tuple{m.n_layer, config.n_layer, "n_layer"},
                                   {m.n_head, config.n_head, "n_head"},
                                   {m.n_embd, config.n_embd, "n_embd"},
                                   {m.vocab_size, config.vocab_size, "vocab_size"},
                                   {m.seq_len, config.seq_len, "seq_len"}}) {
    if (saved != want) {
      throw Error(ErrorCode::kConfig,
                  cat(checkpoint, ": the checkpoint is of another model: its ", name, " is ", saved,
                      ", the configured model's ", want, "; resume with the model it was saved from"));
    }
  }
}

void verify_checkpoint(const std::string& checkpoint, int part, int parts) {
  const CheckpointState state = read_checkpoint_state(checkpoint);
  int64_t index = 0;
  for (const auto& file : open_checked(checkpoint, state)) {
    for (const SafetensorsEntry& e : file->entries()) {
      if (index++ % parts == part) verify_tensor(*file, e, state);
    }
  }
}

std::vector<std::string> resume_candidates(const std::string& dir, std::vector<std::string>* reasons) {
  std::vector<std::string> candidates;
  try {
    candidates.push_back(latest_checkpoint(dir));
  } catch (const Error& e) {
    if (reasons != nullptr) reasons->push_back(e.what());
  }
  std::error_code ec;
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string n = entry.path().filename().string();
    if (entry.is_directory() && n.starts_with("step_") && !n.ends_with(".tmp")) steps.push_back(entry.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const std::string& s : steps) {
    if (candidates.empty() || fs::path(s).filename() != fs::path(candidates.front()).filename())
      candidates.push_back(s);
  }
  return candidates;
}

std::string resume_checkpoint(const std::string& dir, std::vector<std::string>* skipped) {
  std::vector<std::string> reasons;
  for (const std::string& c : resume_candidates(dir, &reasons)) {
    try {
      verify_checkpoint(c);
      return c;
    } catch (const Error& e) {
      reasons.push_back(cat(c, ": ", e.what()));
      if (skipped != nullptr) skipped->push_back(reasons.back());
    }
  }
  std::string all;
  for (const std::string& r : reasons) all += "\n  " + r;
  throw Error(ErrorCode::kNotFound, cat(dir, ": no checkpoint to resume from verifies:", all));
}

void load_checkpoint_by_name(const std::string& checkpoint, Gpt& model, std::vector<float>* m, std::vector<float>* v) {
  // The manifest's files (a single-device checkpoint has one pair, a pipelined run's one per stage); of their
  // tensors only those this model reads are read through and verified — a stage of a large model reads its own
  // range, not every stage's.
  const CheckpointState state = read_checkpoint_state(checkpoint);
  std::vector<std::unique_ptr<SafetensorsFile>> params, moments;
  for (auto& file : open_checked(checkpoint, state)) {
    const std::string n = fs::path(file->path()).filename().string();
    if (n.starts_with("model"))
      params.push_back(std::move(file));
    else if (n.starts_with("optimizer") && m != nullptr)
      moments.push_back(std::move(file));
  }
  auto find = [&](const std::vector<std::unique_ptr<SafetensorsFile>>& files, const std::string& name,
                  const char* what) -> const SafetensorsEntry& {
    for (const auto& f : files) {
      if (!f->has(name)) continue;
      verify_tensor(*f, f->at(name), state);
      return f->at(name);
    }
    throw Error(ErrorCode::kNotFound,
                cat(checkpoint, ": no ", what, " file holds '", name, "'; was it saved from a different model?"));
  };
  if (m != nullptr) {
    m->assign(static_cast<size_t>(model.num_params()), 0.0f);
    v->assign(static_cast<size_t>(model.num_params()), 0.0f);
  }
  const TensorParallel& tp = model.tp();
  // This rank's shard of a whole tensor (all of it without tensor parallelism).
  auto take = [&](const Gpt::Param& p, const float* whole, float* shard) {
    tp_runs(p.split, p.full_shape, tp.rank, tp.size,
            [&](int64_t full, int64_t mine, int64_t count) { std::copy_n(whole + full, count, shard + mine); });
  };
  int64_t offset = 0;
  for (const Gpt::Param& p : model.params()) {
    const Shape& s = p.full_shape;
    const SafetensorsEntry& e = find(params, p.name, "model");
    const std::vector<int64_t> want = hf_dims(p);
    if (e.dtype != DType::kF32 || e.shape != want) {
      throw Error(ErrorCode::kIo, cat(checkpoint, ": tensor '", p.name, "' is ", dtype_name(e.dtype),
                                      " of another shape than the model's; was it saved from a different model?"));
    }
    const auto* data = static_cast<const float*>(e.data);
    std::vector<float> host(data, data + s.numel()), shard(static_cast<size_t>(p.value.numel()));
    if (p.hf_transposed) host = transposed(host, s[1], s[0]);
    take(p, host.data(), shard.data());
    copy_from_host(p.value, shard.data());
    if (m != nullptr) {
      for (const auto& [prefix, flat] : {std::pair{"m.", m}, {"v.", v}}) {
        const SafetensorsEntry& me = find(moments, prefix + p.name, "optimizer");
        if (me.dtype != DType::kF32 || me.shape != dims(s)) {
          throw Error(ErrorCode::kIo, cat(checkpoint, ": tensor '", prefix, p.name, "' has the wrong shape"));
        }
        take(p, static_cast<const float*>(me.data), flat->data() + offset);
      }
    }
    offset += p.value.numel();
  }
  model.parameters_changed();
}

void load_checkpoint(const std::string& checkpoint, Gpt& model, const OptimizerState* optimizer) {
  std::vector<float> m, v;
  load_checkpoint_by_name(checkpoint, model, optimizer ? &m : nullptr, optimizer ? &v : nullptr);
  if (optimizer != nullptr) {
    copy_from_host(optimizer->m, m.data());
    copy_from_host(optimizer->v, v.data());
  }
}

}  // namespace h2
