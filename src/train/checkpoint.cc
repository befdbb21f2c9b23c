// Checkpoint saving and loading (see checkpoint.h for the layout and the crash guarantees).
#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

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

}  // namespace

std::string save_checkpoint(const std::string& dir, Gpt& model, const OptimizerState& optimizer,
                            const CheckpointState& state, int keep) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(state.step));
  const fs::path final_dir = fs::path(dir) / name, tmp_dir = fs::path(dir) / (std::string(name) + ".tmp");
  std::error_code ec;
  fs::create_directories(dir, ec);
  fs::remove_all(tmp_dir, ec);
  if (!fs::create_directories(tmp_dir, ec) && ec) {
    throw Error(ErrorCode::kIo, cat(tmp_dir.string(), ": cannot create the checkpoint folder: ", ec.message()));
  }

  // Parameters in Hugging Face layout; the host copies must outlive the write.
  std::vector<std::vector<float>> keep_alive;
  std::vector<SafetensorsEntry> params, moments;
  const std::vector<float> m = to_host(optimizer.m), v = to_host(optimizer.v);
  int64_t offset = 0;
  for (const Gpt::Param& p : model.params()) {
    const Shape& s = p.value.shape();
    keep_alive.push_back(to_host(p.value));
    if (p.hf_transposed) {
      keep_alive.back() = transposed(keep_alive.back(), s[0], s[1]);
      params.push_back({p.name, DType::kF32, {s[1], s[0]}, keep_alive.back().data()});
    } else {
      params.push_back({p.name, DType::kF32, dims(s), keep_alive.back().data()});
    }
    moments.push_back({"m." + p.name, DType::kF32, dims(s), m.data() + offset});
    moments.push_back({"v." + p.name, DType::kF32, dims(s), v.data() + offset});
    offset += p.value.numel();
  }
  write_safetensors((tmp_dir / "model.safetensors").string(), params, {{"format", "pt"}, {"producer", "h2"}});
  write_safetensors((tmp_dir / "optimizer.safetensors").string(), moments);
  const nlohmann::ordered_json json = {
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
      {"files", {{"model", "model.safetensors"}, {"optimizer", "optimizer.safetensors"}}}};
  write_file_atomic((tmp_dir / "state.json").string(), json.dump(2) + "\n");

  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec)
    throw Error(ErrorCode::kIo, cat(final_dir.string(), ": cannot move the checkpoint into place: ", ec.message()));
  write_file_atomic((fs::path(dir) / "latest").string(), std::string(name) + "\n");

  if (keep > 0) {  // drop the oldest complete checkpoints beyond `keep`
    std::vector<fs::path> all;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string n = entry.path().filename().string();
      if (entry.is_directory() && n.starts_with("step_") && !n.ends_with(".tmp")) all.push_back(entry.path());
    }
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i], ec);
  }
  return final_dir.string();
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
    if (json.at("version") != kCheckpointVersion) {
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
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kIo, cat(path, ": malformed checkpoint state: ", e.what()));
  }
  return state;
}

void load_checkpoint(const std::string& checkpoint, Gpt& model, const OptimizerState* optimizer) {
  const SafetensorsFile params((fs::path(checkpoint) / "model.safetensors").string());
  std::unique_ptr<SafetensorsFile> moments;
  if (optimizer != nullptr)
    moments = std::make_unique<SafetensorsFile>((fs::path(checkpoint) / "optimizer.safetensors").string());
  int64_t offset = 0;
  for (const Gpt::Param& p : model.params()) {
    const Shape& s = p.value.shape();
    const SafetensorsEntry& e = params.at(p.name);
    const std::vector<int64_t> want = p.hf_transposed ? std::vector<int64_t>{s[1], s[0]} : dims(s);
    if (e.dtype != DType::kF32 || e.shape != want) {
      throw Error(ErrorCode::kIo, cat(params.path(), ": tensor '", p.name, "' is ", dtype_name(e.dtype),
                                      " of another shape than the model's; was it saved from a different model?"));
    }
    const auto* data = static_cast<const float*>(e.data);
    std::vector<float> host(data, data + p.value.numel());
    if (p.hf_transposed) host = transposed(host, s[1], s[0]);
    copy_from_host(p.value, host.data());
    if (moments) {
      for (const auto& [prefix, flat] : {std::pair{"m.", &optimizer->m}, {"v.", &optimizer->v}}) {
        const SafetensorsEntry& me = moments->at(prefix + p.name);
        if (me.dtype != DType::kF32 || me.shape != dims(s)) {
          throw Error(ErrorCode::kIo, cat(moments->path(), ": tensor '", prefix, p.name, "' has the wrong shape"));
        }
        copy_from_host(flat->slice(offset, offset + p.value.numel()), me.data);
      }
    }
    offset += p.value.numel();
  }
}

}  // namespace h2
