// Loads a SavedModel the way TF Serving does (tensorflow::LoadSavedModel, tag "serve", default
// session options) and runs its signatures on requests read from stdin, answering on stdout.
//
// Usage: saved_model_runner EXPORT_DIR. Every message is a frame: an 8-byte little-endian length,
// then that many bytes. On start it answers one frame: "" once loaded, else the load error (and
// exits 1). Then, per request until stdin ends:
//   request:  signature name, input count n (decimal), n x (input key, serialized TensorProto),
//             repetitions r (decimal)
//   response: status ("" or the error message); when "", output count m, m x (output key,
//             serialized TensorProto, from the last run), then r float64 latencies in
//             microseconds, each the TensorProto -> Tensor conversion, Session::Run and
//             Tensor -> TensorProto conversion of one run, as the server does per request.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/cc/saved_model/loader.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"

namespace {

bool ReadFrame(std::string* out) {
  uint64_t size = 0;
  if (std::fread(&size, sizeof(size), 1, stdin) != 1) return false;
  out->resize(size);
  return size == 0 || std::fread(&(*out)[0], 1, size, stdin) == size;
}

void WriteFrame(const std::string& data) {
  const uint64_t size = data.size();
  std::fwrite(&size, sizeof(size), 1, stdout);
  std::fwrite(data.data(), 1, data.size(), stdout);
}

// Runs `signature` once on `inputs`; fills `outputs` (sorted by key) or returns the error.
absl::Status RunOnce(tensorflow::SavedModelBundle& bundle, const std::string& signature,
                     const std::vector<std::pair<std::string, std::string>>& inputs,
                     std::vector<std::pair<std::string, std::string>>* outputs) {
  const auto& signatures = bundle.meta_graph_def.signature_def();
  auto found = signatures.find(signature);
  if (found == signatures.end()) {
    return absl::NotFoundError(absl::StrCat("no signature named ", signature));
  }
  std::vector<std::pair<std::string, tensorflow::Tensor>> feeds;
  for (const auto& [key, serialized] : inputs) {
    auto input = found->second.inputs().find(key);
    if (input == found->second.inputs().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("signature ", signature, " has no input ", key));
    }
    tensorflow::TensorProto proto;
    tensorflow::Tensor tensor;
    if (!proto.ParseFromString(serialized) || !tensor.FromProto(proto)) {
      return absl::InvalidArgumentError(absl::StrCat("input ", key, " is not a TensorProto"));
    }
    feeds.emplace_back(input->second.name(), std::move(tensor));
  }
  std::vector<std::string> keys, names;
  for (const auto& [key, output] : found->second.outputs()) {
    keys.push_back(key);
    names.push_back(output.name());
  }
  std::vector<tensorflow::Tensor> fetched;
  absl::Status status = bundle.session->Run(feeds, names, {}, &fetched);
  if (!status.ok()) return status;
  outputs->clear();
  for (size_t i = 0; i < keys.size(); ++i) {
    tensorflow::TensorProto proto;
    fetched[i].AsProtoTensorContent(&proto);
    outputs->emplace_back(keys[i], proto.SerializeAsString());
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s EXPORT_DIR\n", argv[0]);
    return 2;
  }
  tensorflow::SavedModelBundle bundle;
  absl::Status loaded = tensorflow::LoadSavedModel(
      tensorflow::SessionOptions(), tensorflow::RunOptions(), argv[1],
      {"serve"}, &bundle);
  WriteFrame(loaded.ok() ? "" : std::string(loaded.message()));
  std::fflush(stdout);
  if (!loaded.ok()) return 1;

  std::string signature, count, repetitions;
  while (ReadFrame(&signature)) {
    std::vector<std::pair<std::string, std::string>> inputs, outputs;
    if (!ReadFrame(&count)) return 3;
    inputs.resize(std::stoul(count));
    for (auto& [key, serialized] : inputs) {
      if (!ReadFrame(&key) || !ReadFrame(&serialized)) return 3;
    }
    if (!ReadFrame(&repetitions)) return 3;
    std::vector<double> latencies;
    absl::Status status;
    for (unsigned long r = std::stoul(repetitions); status.ok() && r > 0; --r) {
      const auto start = std::chrono::steady_clock::now();
      status = RunOnce(bundle, signature, inputs, &outputs);
      const std::chrono::duration<double, std::micro> took =
          std::chrono::steady_clock::now() - start;
      latencies.push_back(took.count());
    }
    WriteFrame(status.ok() ? "" : std::string(status.message()));
    if (status.ok()) {
      WriteFrame(std::to_string(outputs.size()));
      for (const auto& [key, serialized] : outputs) {
        WriteFrame(key);
        WriteFrame(serialized);
      }
      WriteFrame(std::string(reinterpret_cast<const char*>(latencies.data()),
                             latencies.size() * sizeof(double)));
    }
    std::fflush(stdout);
  }
  return 0;
}
