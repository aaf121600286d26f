// Data-parallel training of an MLP on Fashion-MNIST with libringrun.
//
//   ringrun -np 2 build/bin/fashion_mnist [--epochs N] [--batch B] [--hidden H] [--lr LR]
//                                         [--seed S] [--data DIR]
//
// Every rank shuffles the training set with the same seed; each global batch of B samples is
// split across the ranks and each computes the gradient of its slice. The update is sharded
// (ZeRO stage 1): one ringrun_reducescatter(AVERAGE) gives each rank the mean gradient of its
// 1/np of the parameters, the rank applies SGD with momentum to that shard only (so it keeps
// momentum for its shard only), and one ringrun_allgather hands every rank the whole updated
// model. That moves the same bytes as an allreduce of the gradient, but the update, which every
// rank would otherwise repeat, is split too. So the same global batch and seed give the same
// model at any np (up to float summation order), and the per-rank work (single-threaded)
// shrinks as np grows. Parameters start as a broadcast of rank 0's. Rank 0 prints loss and
// accuracy per epoch and ends with "test_accuracy=0.XXXX".
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ringrun/ringrun.h"

namespace {

constexpr int kInputs = 784;
constexpr int kClasses = 10;

struct Dataset {
  std::vector<float> images;  // n x 784, in [0, 1]
  std::vector<uint8_t> labels;
  int n = 0;
};

uint32_t BigEndian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

bool ReadGz(const std::string& path, std::vector<unsigned char>* out, std::string* err) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    *err = path + ": cannot open";
    return false;
  }
  unsigned char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out->insert(out->end(), buf, buf + n);
  const bool ok = n == 0;
  if (!ok) *err = path + ": corrupt gzip";
  gzclose(f);
  return ok;
}

bool Load(const std::string& dir, const std::string& prefix, Dataset* d, std::string* err) {
  std::vector<unsigned char> img, lab;
  if (!ReadGz(dir + "/" + prefix + "-images-idx3-ubyte.gz", &img, err)) return false;
  if (!ReadGz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", &lab, err)) return false;
  if (img.size() < 16 || lab.size() < 8 || BigEndian(&img[0]) != 2051 ||
      BigEndian(&lab[0]) != 2049) {
    *err = dir + "/" + prefix + ": not IDX files";
    return false;
  }
  d->n = static_cast<int>(BigEndian(&img[4]));
  if (BigEndian(&lab[4]) != static_cast<uint32_t>(d->n) ||
      img.size() != 16 + size_t(d->n) * kInputs || lab.size() != 8 + size_t(d->n)) {
    *err = dir + "/" + prefix + ": sizes do not match";
    return false;
  }
  d->images.resize(size_t(d->n) * kInputs);
  for (size_t i = 0; i < d->images.size(); ++i) d->images[i] = img[16 + i] / 255.0f;
  d->labels.assign(lab.begin() + 8, lab.end());
  return true;
}

// Parameters and gradients share one flat layout, so that the gradient is one allreduce.
struct Layout {
  int hidden;
  size_t w1, b1, w2, b2, total;
  explicit Layout(int h) : hidden(h) {
    w1 = 0;
    b1 = w1 + size_t(kInputs) * h;
    w2 = b1 + h;
    b2 = w2 + size_t(h) * kClasses;
    total = b2 + kClasses;
  }
};

// acc[j] += a * x[j]: the kernel of both layers; cloned for AVX2 machines.
__attribute__((target_clones("arch=haswell", "default"))) void Axpy(float* __restrict acc, float a,
                                                                    const float* __restrict x,
                                                                    int n) {
  for (int j = 0; j < n; ++j) acc[j] += a * x[j];
}

__attribute__((target_clones("arch=haswell", "default"))) float Dot(const float* __restrict a,
                                                                    const float* __restrict b,
                                                                    int n) {
  float s = 0;
  for (int j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

class Mlp {
 public:
  explicit Mlp(int hidden) : l_(hidden) {}
  const Layout& layout() const { return l_; }

  // Writes the initial parameters to p[0, layout().total).
  void Init(float* p, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n1(0, std::sqrt(2.0f / kInputs));
    std::normal_distribution<float> n2(0, std::sqrt(2.0f / l_.hidden));
    std::fill(p, p + l_.total, 0.0f);
    for (size_t i = l_.w1; i < l_.b1; ++i) p[i] = n1(rng);
    for (size_t i = l_.w2; i < l_.b2; ++i) p[i] = n2(rng);
  }

  // Forward one sample; returns the loss and writes probabilities.
  float Forward(const float* p, const float* x, int label, float* h, float* prob) const {
    const int H = l_.hidden;
    std::memcpy(h, p + l_.b1, sizeof(float) * H);
    for (int k = 0; k < kInputs; ++k) {
      if (x[k] != 0.0f) Axpy(h, x[k], p + l_.w1 + size_t(k) * H, H);  // images are sparse
    }
    for (int j = 0; j < H; ++j) h[j] = h[j] > 0 ? h[j] : 0;
    return Output(p, h, label, prob);
  }

  // Layer 2 and the softmax from hidden activations `h`; returns the loss, writes `prob`.
  float Output(const float* p, const float* h, int label, float* prob) const {
    float logits[kClasses];
    for (int c = 0; c < kClasses; ++c) logits[c] = p[l_.b2 + c];
    for (int j = 0; j < l_.hidden; ++j) {
      if (h[j] != 0.0f) Axpy(logits, h[j], p + l_.w2 + size_t(j) * kClasses, kClasses);
    }
    const float mx = *std::max_element(logits, logits + kClasses);
    float sum = 0;
    for (int c = 0; c < kClasses; ++c) sum += prob[c] = std::exp(logits[c] - mx);
    for (int c = 0; c < kClasses; ++c) prob[c] /= sum;
    return -std::log(std::max(prob[label], 1e-12f));
  }

  // Adds scale * d(loss)/d(params) of one sample to g.
  // One step's forward and backward over a mini-batch of `n` samples, the same arithmetic as
  // Forward plus backpropagation per sample, but layer 1 is swept input by input for the whole
  // batch, so W1 and its gradient (hidden x 784 floats each) cross the memory bus once per step
  // rather than once per sample. Accumulates into `g`; returns the summed loss.
  double TrainBatch(const float* p, const float* const* xs, const int* labels, int n, float scale,
                    float* g) const {
    const int H = l_.hidden;
    hb_.resize(size_t(n) * H);
    db_.resize(size_t(n) * H);
    for (int i = 0; i < n; ++i) std::memcpy(&hb_[size_t(i) * H], p + l_.b1, sizeof(float) * H);
    for (int k = 0; k < kInputs; ++k) {
      const float* w = p + l_.w1 + size_t(k) * H;
      for (int i = 0; i < n; ++i) {
        if (xs[i][k] != 0.0f) Axpy(&hb_[size_t(i) * H], xs[i][k], w, H);
      }
    }
    double loss = 0;
    float prob[kClasses];
    for (int i = 0; i < n; ++i) {
      float* h = &hb_[size_t(i) * H];
      for (int j = 0; j < H; ++j) h[j] = h[j] > 0 ? h[j] : 0;
      loss += Output(p, h, labels[i], prob);
      float dlogit[kClasses];
      for (int c = 0; c < kClasses; ++c) {
        dlogit[c] = scale * (prob[c] - (c == labels[i] ? 1.0f : 0.0f));
        g[l_.b2 + c] += dlogit[c];
      }
      float* dh = &db_[size_t(i) * H];
      for (int j = 0; j < H; ++j) {
        if (h[j] == 0.0f) {
          dh[j] = 0;
          continue;
        }
        Axpy(g + l_.w2 + size_t(j) * kClasses, h[j], dlogit, kClasses);
        dh[j] = Dot(p + l_.w2 + size_t(j) * kClasses, dlogit, kClasses);
      }
      Axpy(g + l_.b1, 1.0f, dh, H);
    }
    for (int k = 0; k < kInputs; ++k) {
      float* gw = g + l_.w1 + size_t(k) * H;
      for (int i = 0; i < n; ++i) {
        if (xs[i][k] != 0.0f) Axpy(gw, xs[i][k], &db_[size_t(i) * H], H);
      }
    }
    return loss;
  }

 private:
  const Layout l_;
  mutable std::vector<float> hb_, db_;  // per-step scratch: hidden activations, their deltas
};

struct Args {
  int epochs = 10;
  int batch = 128;
  int hidden = 256;
  float lr = 0.05f;
  float momentum = 0.9f;
  uint32_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist";
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (k == "--epochs")
      a->epochs = std::atoi(v);
    else if (k == "--batch")
      a->batch = std::atoi(v);
    else if (k == "--hidden")
      a->hidden = std::atoi(v);
    else if (k == "--lr")
      a->lr = std::strtof(v, nullptr);
    else if (k == "--momentum")
      a->momentum = std::strtof(v, nullptr);
    else if (k == "--seed")
      a->seed = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    else if (k == "--data")
      a->data = v;
    else
      return false;
  }
  return a->epochs > 0 && a->batch > 0 && a->hidden > 0;
}

int Fail(const char* what) {
  std::fprintf(stderr, "fashion_mnist: %s: %s\n", what, ringrun_error_message());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: fashion_mnist [--epochs N] [--batch B] [--hidden H] [--lr LR] "
                 "[--momentum M] [--seed S] [--data DIR]\n");
    return 2;
  }
  if (ringrun_init() != 0) return Fail("ringrun_init");
  const int rank = ringrun_rank(), size = ringrun_size();
  if (args.batch % size != 0) {
    std::fprintf(stderr, "fashion_mnist: --batch %d is not a multiple of np=%d\n", args.batch,
                 size);
    return 2;
  }
  Dataset train, test;
  std::string err;
  if (!Load(args.data, "train", &train, &err) || !Load(args.data, "t10k", &test, &err)) {
    std::fprintf(stderr, "fashion_mnist: rank %d: %s\n", rank, err.c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Mlp model(args.hidden);
  const Layout& l = model.layout();
  // The flat parameter vector, padded to np equal shards; this rank updates shard `rank`.
  const size_t shard = (l.total + size - 1) / size;
  const size_t mine_at = shard * rank;
  std::vector<float> params(shard * size, 0.0f), grad(shard * size, 0.0f);
  std::vector<float> velocity(shard, 0.0f);
  if (rank == 0) model.Init(params.data(), args.seed);
  if (ringrun_broadcast(params.data(), params.size(), RINGRUN_FLOAT32, 0) != 0) {
    return Fail("broadcast");
  }
  if (rank == 0) {
    std::printf("fashion_mnist: np=%d batch=%d hidden=%d lr=%g epochs=%d params=%zu\n", size,
                args.batch, args.hidden, args.lr, args.epochs, l.total);
    std::fflush(stdout);
  }
  std::vector<int> order(train.n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 shuffle_rng(args.seed + 1);
  std::vector<float> h(args.hidden);
  float prob[kClasses];
  const int local = args.batch / size;
  const int steps = train.n / args.batch;
  double test_accuracy = 0;
  std::vector<const float*> xs(local);
  std::vector<int> ys(local);
  for (int epoch = 1; epoch <= args.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), shuffle_rng);  // same on every rank
    double loss_sum = 0;
    for (int s = 0; s < steps; ++s) {
      const int* mine = &order[size_t(s) * args.batch + size_t(rank) * local];
      for (int i = 0; i < local; ++i) {
        xs[i] = &train.images[size_t(mine[i]) * kInputs];
        ys[i] = train.labels[mine[i]];
      }
      loss_sum +=
          model.TrainBatch(params.data(), xs.data(), ys.data(), local, 1.0f / local, grad.data());
      // The mean gradient over the global batch, of this rank's shard (in place: the shard's
      // slot of grad). Then SGD with momentum on the shard, and the whole model to every rank.
      float* g = grad.data() + mine_at;
      float* p = params.data() + mine_at;
      if (ringrun_reducescatter(grad.data(), g, shard, RINGRUN_FLOAT32, RINGRUN_AVERAGE) != 0) {
        return Fail("reducescatter");
      }
      for (size_t i = 0; i < shard; ++i) {
        velocity[i] = args.momentum * velocity[i] - args.lr * g[i];
        p[i] += velocity[i];
      }
      if (ringrun_allgather(p, params.data(), shard, RINGRUN_FLOAT32) != 0) {
        return Fail("allgather");
      }
      std::fill(grad.begin(), grad.end(), 0.0f);  // the next step accumulates from zero
    }
    // Each rank scores its share of the test set; one allreduce sums the counts.
    double stats[4] = {loss_sum, 0, 0, 0};  // train loss, test loss, test correct, test n
    for (int i = rank; i < test.n; i += size) {
      const float* x = &test.images[size_t(i) * kInputs];
      stats[1] += model.Forward(params.data(), x, test.labels[i], h.data(), prob);
      stats[2] += (std::max_element(prob, prob + kClasses) - prob) == test.labels[i];
      stats[3] += 1;
    }
    if (ringrun_allreduce(stats, stats, 4, RINGRUN_FLOAT64, RINGRUN_SUM) != 0) {
      return Fail("allreduce");
    }
    test_accuracy = stats[2] / stats[3];
    if (rank == 0) {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("epoch %d train_loss=%.4f test_loss=%.4f test_accuracy=%.4f time=%.1fs\n", epoch,
                  stats[0] / (double(steps) * args.batch), stats[1] / stats[3], test_accuracy,
                  secs);
      std::fflush(stdout);
    }
  }
  if (rank == 0) std::printf("test_accuracy=%.4f\n", test_accuracy);
  ringrun_shutdown();
  return 0;
}
