#include "transports/ncclnet/plugin_abi.h"

#include <climits>
#include <cstring>
#include <vector>

namespace loom {
namespace ncclnet {
namespace {

using namespace ncclabi;  // NOLINT: the ABI's own names read best unqualified here

template <int V>
struct Types;
template <>
struct Types<8> {
  using Net = ncclNet_v8_t;
  using Props = ncclNetProperties_v8_t;
};
template <>
struct Types<9> {
  using Net = ncclNet_v9_t;
  using Props = ncclNetProperties_v9_t;
};
template <>
struct Types<10> {
  using Net = ncclNet_v10_t;
  using Props = ncclNetProperties_v10_t;
};
template <>
struct Types<11> {
  using Net = ncclNet_v11_t;
  using Props = ncclNetProperties_v11_t;
};
template <>
struct Types<12> {
  using Net = ncclNet_v12_t;
  using Props = ncclNetProperties_v12_t;
};

template <int V>
class Abi final : public PluginAbi {
  using Net = typename Types<V>::Net;
  using Props = typename Types<V>::Props;

 public:
  explicit Abi(const Net* net) : n_(net) {}

  int version() const override { return V; }
  const char* name() const override { return n_->name ? n_->name : ""; }

  std::string missingMembers() const override {
    std::string missing;
    auto need = [&](const void* fn, const char* member) {
      if (fn == nullptr) missing += missing.empty() ? member : std::string(", ") + member;
    };
    need(reinterpret_cast<const void*>(n_->init), "init");
    need(reinterpret_cast<const void*>(n_->devices), "devices");
    need(reinterpret_cast<const void*>(n_->getProperties), "getProperties");
    need(reinterpret_cast<const void*>(n_->listen), "listen");
    need(reinterpret_cast<const void*>(n_->connect), "connect");
    need(reinterpret_cast<const void*>(n_->accept), "accept");
    need(reinterpret_cast<const void*>(n_->regMr), "regMr");
    need(reinterpret_cast<const void*>(n_->deregMr), "deregMr");
    need(reinterpret_cast<const void*>(n_->isend), "isend");
    need(reinterpret_cast<const void*>(n_->irecv), "irecv");
    need(reinterpret_cast<const void*>(n_->test), "test");
    need(reinterpret_cast<const void*>(n_->closeSend), "closeSend");
    need(reinterpret_cast<const void*>(n_->closeRecv), "closeRecv");
    need(reinterpret_cast<const void*>(n_->closeListen), "closeListen");
    return missing;
  }

  size_t maxMessageBytes() const override {
    if constexpr (V == 8) {
      return INT_MAX;  // int sizes
    } else {
      return SIZE_MAX;
    }
  }

  ncclResult_t init(uint64_t commId, ncclDebugLogger_t logger) override {
    if constexpr (V >= 11) {
      return n_->init(&ctx_, commId, &config_, logger, nullptr);
    } else if constexpr (V == 10) {
      return n_->init(logger, nullptr);
    } else {
      return n_->init(logger);
    }
  }

  void finalize() override {
    if constexpr (V >= 11) {
      if (n_->finalize != nullptr) (void)n_->finalize(ctx_);
      ctx_ = nullptr;
    }
  }

  ncclResult_t devices(int* ndev) override { return n_->devices(ndev); }

  ncclResult_t getProperties(int dev, PluginProps* out) override {
    Props p;
    std::memset(&p, 0, sizeof(p));
    ncclResult_t rc = n_->getProperties(dev, &p);
    if (rc != ncclSuccess) return rc;
    out->name = p.name ? p.name : "";
    out->pciPath = p.pciPath ? p.pciPath : "";
    out->guid = p.guid;
    out->ptrSupport = p.ptrSupport;
    out->regIsGlobal = p.regIsGlobal;
    out->speed = p.speed;
    out->port = p.port;
    out->latency = p.latency;
    out->maxComms = p.maxComms;
    out->maxRecvs = p.maxRecvs;
    if constexpr (V == 8) {
      out->forceFlush = 0;
      out->maxP2pBytes = NCCL_ABI_V8_MAX_SIZE_BYTES;  // what NCCL allows a v8 plugin
    } else {
      out->forceFlush = p.forceFlush;
      out->maxP2pBytes = p.maxP2pBytes;
    }
    return ncclSuccess;
  }

  ncclResult_t listen(int dev, void* handle, void** listenComm) override {
    if constexpr (V >= 11) {
      return n_->listen(ctx_, dev, handle, listenComm);
    } else {
      return n_->listen(dev, handle, listenComm);
    }
  }

  ncclResult_t connect(int dev, void* handle, void** sendComm) override {
    ncclNetDeviceHandle_t* devComm = nullptr;  // host-only: no device offload requested
    if constexpr (V >= 11) {
      return n_->connect(ctx_, dev, handle, sendComm, &devComm);
    } else if constexpr (V == 10) {
      return n_->connect(dev, &config_, handle, sendComm, &devComm);
    } else {
      return n_->connect(dev, handle, sendComm, &devComm);
    }
  }

  ncclResult_t accept(void* listenComm, void** recvComm) override {
    ncclNetDeviceHandle_t* devComm = nullptr;
    return n_->accept(listenComm, recvComm, &devComm);
  }

  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) override {
    return n_->regMr(comm, data, size, type, mhandle);
  }
  ncclResult_t deregMr(void* comm, void* mhandle) override { return n_->deregMr(comm, mhandle); }
  bool hasRegMrDmaBuf() const override { return n_->regMrDmaBuf != nullptr; }
  ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) override {
    return n_->regMrDmaBuf(comm, data, size, type, offset, fd, mhandle);
  }

  ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request) override {
    if constexpr (V == 8) {
      return n_->isend(sendComm, data, static_cast<int>(size), tag, mhandle, request);
    } else if constexpr (V == 9) {
      return n_->isend(sendComm, data, size, tag, mhandle, request);
    } else {
      return n_->isend(sendComm, data, size, tag, mhandle, nullptr, request);
    }
  }

  ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags,
                     void** mhandles, void** request) override {
    if constexpr (V == 8) {
      int isizes[kMaxGroup];
      for (int i = 0; i < n && i < kMaxGroup; ++i) isizes[i] = static_cast<int>(sizes[i]);
      return n_->irecv(recvComm, n, data, isizes, tags, mhandles, request);
    } else if constexpr (V == 9) {
      return n_->irecv(recvComm, n, data, const_cast<size_t*>(sizes), tags, mhandles, request);
    } else {
      void* phandles[kMaxGroup] = {};
      return n_->irecv(recvComm, n, data, const_cast<size_t*>(sizes), tags, mhandles, phandles,
                       request);
    }
  }

  bool hasIflush() const override { return n_->iflush != nullptr; }
  ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                      void** request) override {
    return n_->iflush(recvComm, n, data, sizes, mhandles, request);
  }
  ncclResult_t test(void* request, int* done, int* sizes) override {
    return n_->test(request, done, sizes);
  }
  ncclResult_t closeSend(void* comm) override { return n_->closeSend(comm); }
  ncclResult_t closeRecv(void* comm) override { return n_->closeRecv(comm); }
  ncclResult_t closeListen(void* comm) override { return n_->closeListen(comm); }

 private:
  // Callers never pass more buffers than this (ncclnet_transport.cc checks n first).
  static constexpr int kMaxGroup = kMaxGroupedRecvs;
  const Net* n_;
  void* ctx_ = nullptr;  // v11+
  // Outlives every call: a plugin may keep the pointer it is given (NCCL's lives with its comm).
  ncclNetCommConfig_v10_t config_{NCCL_NET_TRAFFIC_CLASS_UNDEF};
};

}  // namespace

std::unique_ptr<PluginAbi> makePluginAbi(int version, const void* symbol) {
  switch (version) {
    case 8:
      return std::make_unique<Abi<8>>(static_cast<const ncclNet_v8_t*>(symbol));
    case 9:
      return std::make_unique<Abi<9>>(static_cast<const ncclNet_v9_t*>(symbol));
    case 10:
      return std::make_unique<Abi<10>>(static_cast<const ncclNet_v10_t*>(symbol));
    case 11:
      return std::make_unique<Abi<11>>(static_cast<const ncclNet_v11_t*>(symbol));
    case 12:
      return std::make_unique<Abi<12>>(static_cast<const ncclNet_v12_t*>(symbol));
    default:
      return nullptr;
  }
}

}  // namespace ncclnet
}  // namespace loom
