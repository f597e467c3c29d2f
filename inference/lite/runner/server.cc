#include "server.h"

#include <malloc.h>

#include <cstdio>
#include <cstring>

#include "errors.h"
#include "json.h"
#include "predict.h"

namespace msrl {

namespace {
// Request/response buffers above this size are freed after use instead of being kept for the next request.
constexpr size_t kKeepBytes = size_t{4} << 20;
}  // namespace

Server::Server(std::unique_ptr<mindspore::Model> model, int in_fd, int out_fd, const ServerOptions &options)
    : model_(std::move(model)), in_(in_fd), out_fd_(out_fd), options_(options), inputs_(model_->GetInputs()) {
  if (options_.follow) follower_.Init();
  for (const auto &t : inputs_) {
    declared_.push_back(t.Shape());
    current_.push_back(t.Shape());
  }
  feeds_.resize(inputs_.size());
}

int Server::Run() {
  for (;;) {
    uint32_t hdr[2];
    bool at_boundary = false;
    if (!in_.Read(hdr, sizeof hdr, &at_boundary)) return at_boundary ? 0 : Desync("truncated request header");
    if (hdr[0] != kMagic) return Desync("bad magic");
    if (hdr[1] == kOpQuit) return 0;
    if (hdr[1] == kOpPing) {
      out_.Clear();
      out_.Put(kMagic);
      out_.Put(kOk);
      out_.Put<uint32_t>(0);
    } else if (hdr[1] == kOpStats) {
      Stats();
    } else if (hdr[1] == kOpInfer || hdr[1] == kOpTap) {
      if (!Infer(hdr[1] == kOpTap)) return Desync("truncated or malformed infer request");
    } else {
      return Desync("unknown op " + std::to_string(hdr[1]));
    }
    if (!out_.Flush(out_fd_)) return 0;  // client went away
    out_.Shrink(kKeepBytes);
  }
}

// Answers u64 calls, u64 inline_calls, u32 inline wanted: this model's Predicts and how many ran on this thread.
void Server::Stats() {
  out_.Clear();
  out_.Put(kMagic);
  out_.Put(kOk);
  out_.Put(count_.calls);
  out_.Put(count_.inline_calls);
  out_.Put<uint32_t>(options_.inline_actors ? 1 : 0);
}

// The byte stream can no longer be trusted: answer once, then exit.
int Server::Desync(const std::string &msg) {
  Error(kBadRequest, "protocol error: " + msg);
  out_.Flush(out_fd_);
  std::fprintf(stderr, "msrl-lite-runner: protocol error: %s\n", msg.c_str());
  return kExitProtocol;
}

void Server::Error(uint32_t status, const std::string &msg) {
  out_.Clear();
  out_.Put(kMagic);
  out_.Put(status);
  out_.Put(static_cast<uint32_t>(msg.size()));
  out_.Bytes(msg.data(), msg.size());
}

// Reads the whole frame first (keeping the stream in sync), then validates; returns false only when the frame
// itself is unreadable. A payload whose rows exceed the cap is skipped, never buffered, so a refused request
// costs no memory.
bool Server::Infer(bool tap) {
  uint32_t n = 0;
  if (!in_.Get(&n) || n > kMaxInputs) return false;
  if (n > feeds_.size()) feeds_.resize(n);
  std::string refused;
  uint64_t rows = 0;
  for (uint32_t i = 0; i < n; ++i) {
    Feed &f = feeds_[i];
    uint32_t ndim = 0;
    if (!in_.Get(&f.dtype) || !in_.Get(&ndim) || ndim > kMaxRank) return false;
    f.dims.resize(ndim);
    if (!in_.Read(f.dims.data(), ndim * sizeof(int64_t)) || !in_.Get(&f.nbytes)) return false;
    if (f.nbytes > (uint64_t{1} << 32)) return false;
    if (i == 0 && ndim > 0 && f.dims[0] > 0) rows = static_cast<uint64_t>(f.dims[0]);
    if (refused.empty() && ndim > 0 && options_.max_rows > 0 && f.dims[0] > 0 &&
        static_cast<uint64_t>(f.dims[0]) > options_.max_rows) {
      const std::string name = i < inputs_.size() ? " '" + inputs_[i].Name() + "'" : "";
      refused = "input " + std::to_string(i) + name + ": " + std::to_string(f.dims[0]) +
                " rows exceed the runner's cap of " + std::to_string(options_.max_rows) +
                " rows per request (--max-rows; split the batch)";
    }
    if (!refused.empty()) {
      if (!in_.Skip(f.nbytes)) return false;
      continue;
    }
    f.data.resize(f.nbytes);
    if (!in_.Read(f.data.data(), f.nbytes)) return false;
  }
  if (!refused.empty()) {
    Error(kBadRequest, refused);
    return true;
  }
  if (options_.hook != nullptr) options_.hook(rows);
  std::string err = Validate(n);
  if (!err.empty()) {
    Error(kBadRequest, err);
    return true;
  }
  err = Predict(n, tap);
  if (!err.empty()) Error(kInferFailed, err);
  ReleaseLargeBuffers(n);
  return true;
}

std::string Server::Validate(uint32_t n) const {
  if (n != inputs_.size()) {
    return "expected " + std::to_string(inputs_.size()) + " inputs, got " + std::to_string(n);
  }
  for (uint32_t i = 0; i < n; ++i) {
    const Feed &f = feeds_[i];
    const auto who = [&] { return "input " + std::to_string(i) + " '" + inputs_[i].Name() + "': "; };
    const int want = DtypeCode(inputs_[i].DataType());
    if (f.dtype != static_cast<uint32_t>(want)) {
      return who() + "dtype code " + std::to_string(f.dtype) + " != expected " + kDtypes[want].name;
    }
    const auto &decl = declared_[i];
    if (!decl.empty() && f.dims.size() != decl.size()) {
      return who() + "rank " + std::to_string(f.dims.size()) + " != expected " + std::to_string(decl.size());
    }
    uint64_t elems = 1;
    for (size_t d = 0; d < f.dims.size(); ++d) {
      if (f.dims[d] < 0) return who() + "negative dimension";
      // The batch (dim 0) is resized, as in the in-process library: a model converted at a fixed batch (full
      // quantization calibrates at batch 1) runs at any batch.
      if (d > 0 && !decl.empty() && decl[d] >= 0 && decl[d] != f.dims[d]) {
        return who() + "dim " + std::to_string(d) + " is " + std::to_string(f.dims[d]) + ", model needs " +
               std::to_string(decl[d]);
      }
      elems *= static_cast<uint64_t>(f.dims[d]);
    }
    if (f.nbytes != elems * kDtypes[want].itemsize) {
      return who() + "nbytes " + std::to_string(f.nbytes) + " != " + std::to_string(elems * kDtypes[want].itemsize);
    }
  }
  return "";
}

std::string Server::Predict(uint32_t n, bool tap) {
  bool resize = false;
  for (uint32_t i = 0; i < n; ++i) resize |= feeds_[i].dims != current_[i];
  if (resize && predicted_ && rebuildable_ && options_.rebuild) {  // see ServerOptions::rebuild
    KeptModels::Shapes want(current_);
    for (uint32_t i = 0; i < n; ++i) want[i] = feeds_[i].dims;
    std::unique_ptr<mindspore::Model> next = kept_.Take(want);
    const bool ran = next != nullptr;
    if (!ran) {
      next = options_.rebuild();
      rebuildable_ = next != nullptr;
    }
    if (next != nullptr) {
      inputs_.clear();
      outputs_.clear();
      kept_.Keep(current_, std::move(model_));
      model_ = std::move(next);
      inputs_ = model_->GetInputs();
      if (options_.follow && !ran) follower_.Init();  // the new model's threads too
      predicted_ = ran;
      resize = false;
      for (uint32_t i = 0; i < n; ++i) {
        current_[i] = inputs_[i].Shape();
        resize |= feeds_[i].dims != current_[i];
      }
    }
  }
  if (resize) {
    std::vector<std::vector<int64_t>> dims(n);
    for (uint32_t i = 0; i < n; ++i) dims[i] = feeds_[i].dims;
    mindspore::Status st = model_->Resize(inputs_, dims);
    if (st.IsError()) return "resize failed: " + OneLine(st.ToString());
    inputs_ = model_->GetInputs();
    for (uint32_t i = 0; i < n; ++i) current_[i] = feeds_[i].dims;
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (feeds_[i].nbytes == 0) continue;
    void *dst = inputs_[i].MutableData();
    if (dst == nullptr || inputs_[i].DataSize() != feeds_[i].nbytes) return "cannot allocate input buffer";
    std::memcpy(dst, feeds_[i].data.data(), feeds_[i].nbytes);
  }
  if (count_.HandsOff(options_.inline_actors)) follower_.Follow();  // Lite's thread runs the graph: keep it close
  out_.Clear();
  out_.Put(kMagic);
  out_.Put(kOk);
  mindspore::Status st;
  predicted_ = true;
  if (!tap) {
    st = PredictHere(model_.get(), inputs_, &outputs_, options_.inline_actors, &count_);
  } else {
    // Response body: u32 n_kernels, then per kernel its name, type and outputs (each as a model output is sent).
    uint32_t kernels = 0;
    Writer body;
    auto after = [&](const std::vector<mindspore::MSTensor> &, const std::vector<mindspore::MSTensor> &outs,
                     const mindspore::MSCallBackParam &op) {
      ++kernels;
      for (const std::string *s : {&op.node_name, &op.node_type}) {
        body.Put(static_cast<uint32_t>(s->size()));
        body.Bytes(s->data(), s->size());
      }
      uint32_t carried = 0;
      for (const auto &t : outs) carried += DtypeCode(t.DataType()) >= 0 && t.Data() != nullptr;
      body.Put(carried);
      for (auto t : outs) {
        if (DtypeCode(t.DataType()) >= 0 && t.Data() != nullptr) PutTensor(&body, &t);
      }
      return true;
    };
    st = PredictHere(model_.get(), inputs_, &outputs_, options_.inline_actors, &count_, after);
    out_.Put(kernels);
    out_.Append(body);
    return st.IsError() ? "predict failed: " + OneLine(st.ToString()) : "";
  }
  if (st.IsError()) return "predict failed: " + OneLine(st.ToString());
  out_.Put(static_cast<uint32_t>(outputs_.size()));
  for (auto &t : outputs_) {
    if (DtypeCode(t.DataType()) < 0) return "output '" + t.Name() + "' has a dtype the protocol cannot carry";
    PutTensor(&out_, &t);
  }
  return "";
}

// One tensor as the protocol frames it: name, dtype code, dims, nbytes, bytes.
void Server::PutTensor(Writer *w, mindspore::MSTensor *t) {
  const std::string name = t->Name();
  w->Put(static_cast<uint32_t>(name.size()));
  w->Bytes(name.data(), name.size());
  w->Put(static_cast<uint32_t>(DtypeCode(t->DataType())));
  const auto &shape = t->Shape();
  w->Put(static_cast<uint32_t>(shape.size()));
  w->Bytes(shape.data(), shape.size() * sizeof(int64_t));
  const uint64_t nbytes = t->DataSize();
  w->Put(nbytes);
  if (nbytes) w->Bytes(t->MutableData(), nbytes);
}

// After a large request, give its feed buffers back and ask malloc to return freed heap pages to the system;
// Lite's own buffers for the large shape stay until the next resize.
void Server::ReleaseLargeBuffers(uint32_t n) {
  bool large = false;
  for (uint32_t i = 0; i < n; ++i) {
    if (feeds_[i].data.capacity() > kKeepBytes) {
      std::vector<uint8_t>().swap(feeds_[i].data);
      large = true;
    }
  }
  if (large) malloc_trim(0);
}

}  // namespace msrl
