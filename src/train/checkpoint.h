// Checkpoints of a training run, one folder per save:
//   <dir>/step_000100/model.safetensors      parameters, Hugging Face GPT-2 names and layouts
//   <dir>/step_000100/optimizer.safetensors  AdamW moments "m.<name>", "v.<name>" (H2's layout)
//     (a pipelined run writes one pair per stage, model.stage<k>.safetensors and optimizer.stage<k>...; a
//      reader looks every parameter up by name in whichever file holds it)
//   <dir>/step_000100/state.json             format version, step, model config, data position, and the manifest:
//                                            every file's size and each of its tensors' CRC-32, as its writer
//                                            wrote them (computed from the bytes in memory, never read back)
//   (a load reads only the files the manifest names and verifies each tensor's checksum and that every value is
//    finite; a resume falls back to the newest checkpoint that verifies)
//   <dir>/latest                             the name of the newest complete checkpoint
// A save writes into "step_000100.tmp", renames it into place and only then points `latest` at it, so a crash
// at any moment leaves the previous checkpoint intact and `latest` naming a complete one. Checkpoints are per
// parameter name, so they do not depend on how a run split the model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/dataset.h"
#include "model/gpt.h"
#include "train/optimizer.h"

namespace h2 {

inline constexpr int kCheckpointVersion = 2;  // 2: the manifest; version 1 (no checksums) loads unverified

// A checkpoint file as the manifest records it.
struct ManifestFile {
  uint64_t bytes = 0;
  std::map<std::string, uint32_t> crc32;  // per tensor, over its bytes (zlib's CRC-32)
};
using Manifest = std::map<std::string, ManifestFile>;  // by file name, within the checkpoint's folder

// A manifest as JSON text and back (how state.json holds it, and how a pipelined run's writers hand theirs to
// the rank that writes state.json). The parse throws Error(kIo) naming `where` when the text is not a manifest.
std::string manifest_json(const Manifest& manifest);
Manifest parse_manifest(const std::string& text, const std::string& where);

struct CheckpointState {
  int64_t step = 0;  // optimizer steps completed
  GptConfig model;
  LoaderPosition data;
  uint64_t data_seed = 0;
  // The precision the run computed in; the checkpoint's weights are its f32 master copy either way. Older
  // checkpoints, which do not say, were f32.
  Precision precision = Precision::kF32;
  Manifest files;  // read from state.json; for write_checkpoint_state, what the files' writers returned
};

// Saves into `dir`/step_NNNNNN and keeps the newest `keep` checkpoints (0 = all). Returns the folder written.
std::string save_checkpoint(const std::string& dir, Gpt& model, const OptimizerState& optimizer,
                            const CheckpointState& state, int keep, const std::string& protect = "");

// The pieces of save_checkpoint, for runs whose model is split over processes (pipeline/hetero_train.cc):
// one process begins (the empty "<name>.tmp" folder), each writes its part's files, one writes the state and
// commits (rename, `latest`, pruning to `keep`).
std::string checkpoint_name(int64_t step);  // "step_000100"
std::string begin_checkpoint(const std::string& dir, int64_t step);
// A parameter as a checkpoint holds it: the whole tensor (every tensor-parallel shard put together), its value
// in Hugging Face layout, its AdamW moments in H2's.
struct SavedParam {
  std::string name;
  std::vector<int64_t> hf_shape, shape;
  std::vector<float> value, m, v;
};
// How a tensor-parallel group's shards of a parameter reach its writer, the group's rank 0, point to point: a rank
// that does not write `send`s each of its shards of a split parameter (its value, then its two moments' slices); the
// writer `receive`s rank `from`'s into `count` floats, in the same order. Only the writer holds a whole tensor.
struct ShardGather {
  std::function<void(const float* shard, size_t count)> send;
  std::function<void(int from, float* shard, size_t count)> receive;
};
// Each parameter `include` accepts (all when null), in the model's order, put together whole on the model's TP rank 0
// and given to its `take`, then let go: one whole tensor at a time in the host's memory. m and v are laid out like the
// model's flat parameters. Every TP rank calls this with the same `include`: the others send their shards through
// `gather` and take nothing (a group of one needs no `gather`).
void for_each_saved_param(Gpt& model, const float* m, const float* v,
                          const std::function<bool(const Gpt::Param&)>& include, const ShardGather& gather,
                          const std::function<void(const SavedParam&)>& take);
// model<part>.safetensors and optimizer<part>.safetensors of those parameters, written a tensor at a time as
// for_each_saved_param puts each together, by the model's TP rank 0 (every TP rank calls it: the others send their
// shards). Returns the files written (none on the other TP ranks): each one's size and its tensors' CRC-32 over the
// bytes as they went out of memory — so a file damaged on its way to the disk, or after, fails the load's check.
Manifest write_model_files(const std::string& folder, const std::string& part, Gpt& model, const float* m,
                           const float* v, const std::function<bool(const Gpt::Param&)>& include,
                           const ShardGather& gather);
// Writes state.json with `state.files`, the manifest the writers returned, after checking the folder against it
// without reading a tensor: Error(kIo) naming the file when one it lists is missing or of another size, or the
// folder holds a safetensors file it does not list.
void write_checkpoint_state(const std::string& folder, const CheckpointState& state);
// Moves the folder into place, points `latest` at it and removes the oldest beyond the newest `keep` (0 = none),
// never `protect` (the checkpoint a run resumed from).
std::string commit_checkpoint(const std::string& dir, int64_t step, int keep, const std::string& protect = "");

// Fills every parameter of `model` (any range, any tensor-parallel shard) by name from the checkpoint's model files,
// and when m and v are given, the moments into them (laid out like the flat parameters). Errors name the checkpoint and
// tensor. Every file of the manifest is checked for its size and tensors' names, but only the tensors read are read
// through and verified (checksum, finite values): a rank of a pipelined run reads its own stage's, not the whole
// checkpoint (verify_checkpoint, resume_checkpoint: all of it).
void load_checkpoint_by_name(const std::string& checkpoint, Gpt& model, std::vector<float>* m, std::vector<float>* v);

// The folder `latest` names in `dir`; Error(kNotFound) when there is none.
std::string latest_checkpoint(const std::string& dir);

// Error(kIo) naming the file, the tensor and what is wrong when a checkpoint does not verify: a file of the
// manifest missing or of another size, a tensor's checksum, a NaN or infinite value. With `parts` > 1 it checks
// every file's size and tensor names but reads through only the tensors whose index — over the manifest's files in
// order, each file's tensors in order — is `part` modulo `parts`: that many ranks verify a checkpoint together.
void verify_checkpoint(const std::string& checkpoint, int part = 0, int parts = 1);

// The checkpoints of `dir` a resume tries, in order: the one `latest` names, then every other complete step_*,
// newest first. Why `latest` cannot be read, when it cannot, is added to `reasons`.
std::vector<std::string> resume_candidates(const std::string& dir, std::vector<std::string>* reasons);

// The checkpoint to resume from in `dir`: `latest` if it verifies, else the newest step_* that does; each one
// skipped is added to `skipped` with the reason. Error(kNotFound) when none verifies, with every reason.
std::string resume_checkpoint(const std::string& dir, std::vector<std::string>* skipped);

// Error(kConfig) naming the checkpoint and the first field that differs when `state` is of another model than
// `config` (layers, heads, width, vocabulary, sequence length).
void check_checkpoint_model(const CheckpointState& state, const GptConfig& config, const std::string& checkpoint);

// Reads state.json of a checkpoint folder. Error(kIo) naming the file when it is missing or malformed.
CheckpointState read_checkpoint_state(const std::string& checkpoint);

// Loads parameters (and the optimizer state when given) into `model`. Every parameter of the model must be in
// the file with the right shape; errors name the file and the tensor.
void load_checkpoint(const std::string& checkpoint, Gpt& model, const OptimizerState* optimizer);

}  // namespace h2
