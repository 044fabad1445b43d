// The direct NCCL line of tributary-bench (see lines.h): ncclAllReduce on the bench's device
// buffers with the line's own communicators and streams, nothing of tributary's in between but the
// store used to meet across processes.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

#include "bench/lines.h"
#include "tributary/store.h"

namespace tributary::bench {
namespace {

Status check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status();
  return internal_error(std::string("nccl-direct: ") + what + " failed: " + ncclGetErrorString(r));
}

Status check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status();
  return internal_error(std::string("nccl-direct: ") + what + " failed: " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kInt8: return ncclInt8;
    case DType::kUInt8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMean: return ncclAvg;
  }
  return ncclSum;
}

class NcclReference final : public Line {
 public:
  NcclReference(std::vector<Device> devices, int world) : devices_(std::move(devices)), world_(world) {}
  ~NcclReference() override {
    for (size_t i = 0; i < comms_.size(); ++i) {
      cudaSetDevice(devices_[i].index());
      if (streams_[i] != nullptr) cudaStreamSynchronize(streams_[i]);
      if (comms_[i] != nullptr) ncclCommDestroy(comms_[i]);
      if (streams_[i] != nullptr) cudaStreamDestroy(streams_[i]);
    }
  }

  Status init(const BackendContext& context) {
    const int g = static_cast<int>(devices_.size());
    comms_.assign(devices_.size(), nullptr);
    streams_.assign(devices_.size(), nullptr);
    for (int i = 0; i < g; ++i) {
      TRIBUTARY_RETURN_IF_ERROR(check_cuda(cudaSetDevice(devices_[i].index()), "cudaSetDevice"));
      TRIBUTARY_RETURN_IF_ERROR(check_cuda(cudaStreamCreate(&streams_[i]), "cudaStreamCreate"));
    }
    ncclUniqueId id;
    if (context.rank == 0) TRIBUTARY_RETURN_IF_ERROR(check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    if (context.world_size > 1) {
      if (!context.store) return failed_precondition("nccl-direct: no store to meet the other ranks");
      if (context.rank == 0) {
        TRIBUTARY_RETURN_IF_ERROR(context.store->set(
            "bench/nccl-direct/id", std::string(reinterpret_cast<const char*>(&id), sizeof id)));
      } else {
        auto got = context.store->get("bench/nccl-direct/id", std::chrono::minutes(2));
        if (!got.ok()) return got.status().with_context("nccl-direct: rank 0's unique id");
        std::memcpy(&id, got->data(), sizeof id);
      }
    }
    TRIBUTARY_RETURN_IF_ERROR(check_nccl(ncclGroupStart(), "ncclGroupStart"));
    for (int i = 0; i < g; ++i) {
      cudaSetDevice(devices_[i].index());
      TRIBUTARY_RETURN_IF_ERROR(check_nccl(
          ncclCommInitRank(&comms_[i], world_ * g, id, context.rank * g + i), "ncclCommInitRank"));
    }
    return check_nccl(ncclGroupEnd(), "ncclGroupEnd (communicator setup)");
  }

  std::string spec() const override { return "nccl-direct"; }
  bool reference() const override { return true; }
  int num_replicas_in_sync() const override { return world_ * static_cast<int>(devices_.size()); }

  Status enqueue(ReduceOp op, const PerReplica<Tensor>& inputs, const PerReplica<Tensor>& outputs,
                 std::chrono::milliseconds) override {
    TRIBUTARY_RETURN_IF_ERROR(check_nccl(ncclGroupStart(), "ncclGroupStart"));
    for (size_t i = 0; i < comms_.size(); ++i) {
      TRIBUTARY_RETURN_IF_ERROR(check_nccl(
          ncclAllReduce(inputs[i].data(), outputs[i].data(),
                        static_cast<size_t>(inputs[i].num_elements()), nccl_type(inputs[i].dtype()),
                        nccl_op(op), comms_[i], streams_[i]),
          "ncclAllReduce"));
    }
    return check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  Status drain(std::chrono::milliseconds) override {
    for (size_t i = 0; i < streams_.size(); ++i) {
      TRIBUTARY_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(streams_[i]), "cudaStreamSynchronize"));
    }
    return Status();
  }
  Status all_reduce(ReduceOp op, const PerReplica<Tensor>& inputs,
                    const PerReplica<Tensor>& outputs, std::chrono::milliseconds timeout) override {
    TRIBUTARY_RETURN_IF_ERROR(enqueue(op, inputs, outputs, timeout));
    return drain(timeout);
  }

 private:
  std::vector<Device> devices_;
  int world_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
};

}  // namespace

bool nccl_reference_built() { return true; }

namespace internal {
StatusOr<std::unique_ptr<Line>> nccl_reference(const BackendSpec& spec,
                                               const BackendContext& context, DType, ReduceOp) {
  if (!spec.options.empty()) return invalid_argument("nccl-direct takes no options");
  for (const Device& d : context.devices) {
    if (!d.is_cuda()) return failed_precondition("nccl-direct needs GPU replicas (-g N)");
  }
  auto line = std::make_unique<NcclReference>(context.devices, context.world_size);
  TRIBUTARY_RETURN_IF_ERROR(line->init(context));
  return std::unique_ptr<Line>(std::move(line));
}
}  // namespace internal

}  // namespace tributary::bench
