// bamctl's CPU attention kernel: causal flash attention with a positional bias and SSMax.
//
// For query row r (absolute position i = q_start + r) and key j <= i it computes
//     l_ij = (q_i . k_j + b_h(i, j)) * p_r
// where the caller has folded 1/sqrt(Dh) into q, and p_r is the bias's per-row multiplier:
// SSMax's factor c_h(i) when SSMax scales the bias too (its "logits" scope), else 1. When
// SSMax scales the content score alone, or there is no bias, the caller folds c_h(i) into q
// instead: no bias is then multiplied by it, and folding only rounds the product q . k
// differently, by a few float32 ulps of it, whatever the sign of c_h(i).
//
// Why the factor is applied after the sum, not folded into q and the bias: the reference
// (bamctl/attention_math.py) rounds (s + b) first and then multiplies. With a negative
// factor, c_h(i) * b_h(i - j) turns a prior that grows with distance into large positive
// logits (thousands at 8k tokens for a steep head), and those largest logits carry the
// weights: computed as c q . k + c b, they round at that magnitude in a different place
// than the reference's (s + b) * c, by up to ~4e-3 in the outputs. Formed here in the
// reference's order, the same float32 operations give the same logit unless the two
// products q . k, summed in different orders, straddle a rounding boundary of s + b, and
// then by one ulp of it times c. The cost is one vector add and one multiply per logit
// instead of one multiply-add: nothing measurable next to the two products and the exp.
// Nothing of size (queries x keys) is ever built; the bias comes in one of two forms:
//
// - a distance prior, b_h(i - j) (ALiBi, KERPLE, T5, BAM): read on the fly from one line
//   per head, reversed so that consecutive keys are consecutive floats:
//   prior_rev[h, t] = b_h(L - 1 - t), i.e. b_h(i - j) sits at t = L - 1 - i + j.
// - a piecewise-linear function of a per-query-scaled distance (FIRE):
//   b_h(i, j) = A[h, s] x + B[h, s] with x = psi(i - j) / norm_i and s the number of
//   breakpoints below x. psi is one line shared by the heads, reversed as above. Along a
//   row x falls as j rises, so each piece covers one run of keys: the row's first distance
//   past each breakpoint is found once per query block (a binary search on psi), and a row
//   is then a few runs of one fused multiply-add each, with no search per key.
//
// Certified skipping (docs/engine.md, "Certified block skipping"; bamctl/engine/block_skip.py
// holds the same bound in Python): with skipping on, a key block that lies wholly in the past
// of a query block is skipped when, for every query r of the block (absolute position i), an
// upper bound of its logits there (see block_is_negligible: it holds for either sign of p_r)
// lies more than kEpsilonNats + log(i + 1) below the largest logit r has already computed.
// Row r sees i + 1 keys, so the weights left out sum to less than 2^-40 of the row's total.
// Key blocks are walked nearest first so that this largest logit is known early; a steep
// prior (most BAM heads learn one) then never reads the far past. A negative factor over a prior that
// falls with distance reverses that: its largest logits lie in the far past, whose blocks
// the bound never rules out, and the near ones are read before anything larger is known;
// such a head reads every key, as blockwise and the reference do.
//
// Tiling follows the usual CPU flash-attention layout: blocks of queries in parallel,
// key blocks in sequence with an online softmax (running max and sum), the two products
// as BLAS calls; keys in a query's future are never visited. The BLAS is the one torch
// itself links (its exported Fortran `sgemm_`), so nothing else needs installing.
//
// The keys and values come as the KV cache holds them, float32 or bfloat16 (`--dtype
// bfloat16`). A bfloat16 block is widened into a float32 tile as it is read: exactly, since
// every bfloat16 is a float32, so the products, the prior, SSMax, the running max and sum are
// float32 arithmetic on the cache's own values, the skipping bound included (it takes its key
// norms from the same tile the product reads). No float32 copy of the whole cache is made:
// at 512k tokens that copy would be as large as the cache again, on every call.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

using fVec = at::vec::Vectorized<float>;

// Column-major C (m x n) = alpha * op(A) op(B) + beta * C, as BLAS defines it.
void gemm(bool transpose_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  const char ta = transpose_a ? 'T' : 'N', tb = 'N';
  const int im = m, in = n, ik = k, ilda = lda, ildb = ldb, ildc = ldc;
  const float alpha = 1.f;
  sgemm_(&ta, &tb, &im, &in, &ik, &alpha, a, &ilda, b, &ildb, &beta, c, &ildc);
}

// dst[0:n] = src[0:n] widened to float32: a bfloat16 is the top half of a float32's bits, so
// this is exact (and a loop the compiler vectorises).
void widen(const c10::BFloat16* src, float* dst, int64_t n) {
  const auto* bits = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(dst + i, &word, sizeof(float));
  }
}

// One head's keys or values as the products read them, a block of rows at a time: float32
// storage in place; bfloat16 widened into this thread's float32 tile (`rows` x dim).
template <typename Stored>
class BlockReader {
 public:
  BlockReader(int64_t max_rows, int64_t dim) : tile_(std::is_same_v<Stored, float> ? 0 : max_rows * dim), dim_(dim) {}

  // Rows [j0, j0 + n) of `data` (row stride `stride`): their first row and its stride.
  std::pair<const float*, int64_t> read(const Stored* data, int64_t stride, int64_t j0, int64_t n) {
    if constexpr (std::is_same_v<Stored, float>) {
      return {data + j0 * stride, stride};
    } else {
      for (int64_t j = 0; j < n; ++j) widen(data + (j0 + j) * stride, tile_.data() + j * dim_, dim_);
      return {tile_.data(), dim_};
    }
  }

 private:
  std::vector<float> tile_;
  int64_t dim_;
};

constexpr int64_t kKeyBlock = 512;
constexpr float kEpsilonNats = 27.725887f;  // 40 ln 2: the skipped mass stays below 2^-40 of a row's
constexpr float kSlack = 1e-5f;  // relative: rounding in the bound and in the logit it is compared with

int64_t query_block(int64_t queries) {
  return queries >= 768 ? 256 : (queries >= 192 ? 64 : 32);
}

// row[0:n] = (row[0:n] + prior[0:n]) * scale, the sum rounded first as in the reference;
// returns max(row[0:n]). A null prior leaves the row as it is.
float add_prior_and_max(float* row, const float* prior, float scale, int64_t n) {
  const fVec vscale(scale);
  fVec vmax(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + fVec::size() <= n; j += fVec::size()) {
    fVec x = fVec::loadu(row + j);
    if (prior != nullptr) {
      x = (x + fVec::loadu(prior + j)) * vscale;
      x.store(row + j);
    }
    vmax = at::vec::maximum(vmax, x);
  }
  float best = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, vmax);
  for (; j < n; ++j) {
    if (prior != nullptr) row[j] = (row[j] + prior[j]) * scale;
    best = std::max(best, row[j]);
  }
  return best;
}

// (min, max) of x[0:n].
std::pair<float, float> min_max(const float* x, int64_t n) {
  fVec lo(std::numeric_limits<float>::infinity()), hi(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + fVec::size() <= n; j += fVec::size()) {
    const fVec v = fVec::loadu(x + j);
    lo = at::vec::minimum(lo, v);
    hi = at::vec::maximum(hi, v);
  }
  float low = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return at::vec::minimum(a, b); }, lo);
  float high = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, hi);
  for (; j < n; ++j) {
    low = std::min(low, x[j]);
    high = std::max(high, x[j]);
  }
  return {low, high};
}

// Euclidean norm of x[0:n].
float norm(const float* x, int64_t n) {
  return std::sqrt(at::vec::map_reduce_all<float>([](fVec v) { return v * v; },
                                                  [](fVec a, fVec b) { return a + b; }, x, n));
}

// row[0:n] = exp(row[0:n] - top); returns their sum.
float exp_and_sum(float* row, float top, int64_t n) {
  const fVec vtop(top);
  fVec vsum(0.f);
  int64_t j = 0;
  for (; j + fVec::size() <= n; j += fVec::size()) {
    fVec x = (fVec::loadu(row + j) - vtop).exp_u20();
    x.store(row + j);
    vsum = vsum + x;
  }
  float sum = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, vsum);
  for (; j < n; ++j) {
    row[j] = std::exp(row[j] - top);
    sum += row[j];
  }
  return sum;
}

// Whether key block [j0, j0 + cols) (`keys`: its first key), wholly in the past of the `rows` queries of a block
// (the first at absolute position `first`), can be left out: for every row r an upper bound
// of its logits over the block lies more than kEpsilonNats + log(first + r + 1) below top[r],
// the largest logit r has already computed. `prior` points at the first of the rows + cols - 1
// prior entries the block reads (t = line - 1 - i + j over its rows and keys); `row_scale`
// at the rows' prior multipliers p_r (null: 1).
//
// The bound, for l = (s + b) p with s = q_r . k_j, |s| <= |q_r| max_j |k_j| (Cauchy-Schwarz)
// and b between the block's prior_min and prior_max:
//   p >= 0:  l = p s + p b <= p |q_r| max|k| + p prior_max;
//   p <  0:  p s <= |p| |q_r| max|k| as before, but p b is largest where b is smallest,
//            so l <= |p| |q_r| max|k| + p prior_min.
// Both read |p| |q_r| max|k| + (p >= 0 ? p prior_max : p prior_min). A negative p makes a
// steep prior's far entries the largest logits, and this bound says so: such a block is
// never ruled out on the strength of smaller logits seen nearer. (With p = 1, q_r may carry
// a content-only SSMax factor of either sign: |q_r| includes it.)
bool block_is_negligible(const float* keys, int64_t key_stride, int64_t dim, int64_t cols,
                         const float* prior, int64_t rows, int64_t first, const float* q_norm, const float* row_scale,
                         const float* top) {
  float key_max = 0.f;  // keys: the block's first key, as the product reads it
  for (int64_t j = 0; j < cols; ++j) key_max = std::max(key_max, norm(keys + j * key_stride, dim));
  const auto [prior_min, prior_max] = min_max(prior, rows + cols - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const float p = row_scale ? row_scale[r] : 1.f;
    const float bound = std::fabs(p) * q_norm[r] * key_max + (p >= 0.f ? p * prior_max : p * prior_min);
    const float slack = kSlack * (std::fabs(bound) + std::fabs(top[r]));  // rounding in both
    const float margin = kEpsilonNats + std::log(static_cast<float>(first + r + 1));
    if (!(std::isfinite(bound) && bound + margin + slack < top[r])) return false;
  }
  return true;
}

// row[0:n] = (row[0:n] + A_s x_j + B_s) * scale, x_j = psi[j] / norm, s the piece x_j falls on; returns
// max(row[0:n]). psi[j] = psi(d0 - j): key j of the row is at distance d0 - j. first[k] is the
// row's smallest distance whose x exceeds breakpoint k, so key j lies on piece
// s = #{k : first[k] <= d0 - j}, falling by one at each run boundary as j rises.
float add_pieces_and_max(float* row, const float* psi, float norm, float scale, const int64_t* first, int64_t pieces,
                         const float* slope, const float* offset, int64_t d0, int64_t n) {
  int64_t s = std::upper_bound(first, first + pieces - 1, d0) - first;  // the piece of key 0
  const fVec vnorm(norm), vscale(scale);
  fVec vmax(-std::numeric_limits<float>::infinity());
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; --s) {
    const int64_t end = s == 0 ? n : std::min(n, d0 - first[s - 1] + 1);  // keys at distance >= first[s - 1]
    const fVec va(slope[s]), vb(offset[s]);
    for (; j + fVec::size() <= end; j += fVec::size()) {
      const fVec x = fVec::loadu(psi + j) / vnorm;  // divided, not multiplied by 1/norm: bit for bit torch's x
      const fVec biased = (fVec::loadu(row + j) + at::vec::fmadd(va, x, vb)) * vscale;
      biased.store(row + j);
      vmax = at::vec::maximum(vmax, biased);
    }
    for (; j < end; ++j) {
      row[j] = (row[j] + (slope[s] * (psi[j] / norm) + offset[s])) * scale;
      best = std::max(best, row[j]);
    }
  }
  return std::max(best, at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, vmax));
}

// The two biases the attention loop takes. Each makes, per thread, a `Task` that is pointed
// at one query block of one head (`begin`), may rule out a key block wholly in the block's
// past (`negligible`), and adds the bias to one row of scores, returning its max (`add`).

// b_h(i - j) from one reversed line per head (or no bias at all), the sum times p_r.
struct DistancePrior {
  const float* line = nullptr;       // (H, length) reversed prior lines, or null: no prior
  int64_t length = 0;
  const float* row_scale = nullptr;  // (H, Tq) p_r, or null: 1
  int64_t queries = 0;

  class Task {
   public:
    Task(const DistancePrior& prior, int64_t max_rows) : prior_(prior), q_norm_(max_rows) {}

    void begin(int64_t h, int64_t r0, int64_t rows, int64_t first, const float* q, int64_t q_stride, int64_t dim) {
      line_ = prior_.line ? prior_.line + h * prior_.length : nullptr;
      scale_ = prior_.row_scale ? prior_.row_scale + h * prior_.queries + r0 : nullptr;
      rows_ = rows;
      first_ = first;
      visible_ = first + rows;
      if (line_ != nullptr) {
        for (int64_t r = 0; r < rows; ++r) q_norm_[r] = norm(q + r * q_stride, dim);
      }
    }

    bool negligible(const float* keys, int64_t key_stride, int64_t dim, int64_t j0, int64_t cols, const float* top) const {
      return line_ != nullptr && block_is_negligible(keys, key_stride, dim, cols, line_ + (prior_.length - visible_ + j0),
                                                     rows_, first_, q_norm_.data(), scale_, top);
    }

    float add(float* row, int64_t r, int64_t i, int64_t j0, int64_t n) const {
      const float* prior_row = line_ ? line_ + (prior_.length - 1 - i + j0) : nullptr;
      return add_prior_and_max(row, prior_row, scale_ ? scale_[r] : 1.f, n);
    }

   private:
    const DistancePrior& prior_;
    std::vector<float> q_norm_;
    const float* line_ = nullptr;
    const float* scale_ = nullptr;
    int64_t rows_ = 0, first_ = 0, visible_ = 0;
  };
};

// FIRE's b_h(i, j) = A[h, s] x + B[h, s], x = psi(i - j) / norm_i, the sum times p_r.
struct PiecewisePrior {
  const float* psi = nullptr;        // (length,) reversed: psi[t] = psi(length - 1 - t)
  int64_t length = 0;
  const float* norm = nullptr;       // (Tq,) each query's divisor, > 0
  const float* breaks = nullptr;     // (pieces - 1,) sorted
  const float* slopes = nullptr;     // (H, pieces)
  const float* offsets = nullptr;    // (H, pieces)
  int64_t pieces = 1;
  const float* row_scale = nullptr;  // (H, Tq) p_r, or null: 1
  int64_t queries = 0;

  class Task {
   public:
    Task(const PiecewisePrior& prior, int64_t max_rows) : prior_(prior), first_(max_rows * (prior.pieces - 1)) {}

    // For every row, the smallest distance d (0..i + 1) with psi(d) / norm_i > breakpoint k:
    // x only grows with d, so a binary search per breakpoint. It divides exactly as `add`
    // does, so the run boundaries agree with the piece each x is computed on. (Were two
    // neighbouring psi values ever out of order by a rounding, the only keys affected would
    // have x within an ulp of a breakpoint, where both pieces give the same f.) The searches
    // do not depend on the head; they cost rows x (pieces - 1) x log2(i) steps, next to the
    // rows x i x Dh of the products.
    void begin(int64_t h, int64_t r0, int64_t rows, int64_t first, const float*, int64_t, int64_t) {
      h_ = h;
      r0_ = r0;
      const int64_t m = prior_.pieces - 1;
      const float* psi_end = prior_.psi + prior_.length - 1;  // psi(d) = psi_end[-d]
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = first + r;
        const float n = prior_.norm[r0 + r];
        int64_t lo = 0;
        for (int64_t k = 0; k < m; ++k) {  // thresholds rise with k: each search starts at the last
          int64_t hi = i + 1;
          while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (psi_end[-mid] / n > prior_.breaks[k]) hi = mid; else lo = mid + 1;
          }
          first_[r * m + k] = lo;
        }
      }
    }

    // No key block is tested for skipping: FIRE's bias depends on the query too, so no table
    // bounds a block's; and it is f over x in [0, 1], learned with no pull towards steepness:
    // the test would cost on every block and rarely skip one.
    bool negligible(const float*, int64_t, int64_t, int64_t, int64_t, const float*) const { return false; }

    float add(float* row, int64_t r, int64_t i, int64_t j0, int64_t n) const {
      const int64_t m = prior_.pieces - 1;
      const float scale = prior_.row_scale ? prior_.row_scale[h_ * prior_.queries + r0_ + r] : 1.f;
      return add_pieces_and_max(row, prior_.psi + (prior_.length - 1 - i + j0), prior_.norm[r0_ + r], scale,
                                first_.data() + r * m, prior_.pieces, prior_.slopes + h_ * prior_.pieces,
                                prior_.offsets + h_ * prior_.pieces, i - j0, n);
    }

   private:
    const PiecewisePrior& prior_;
    std::vector<int64_t> first_;  // (rows, pieces - 1)
    int64_t h_ = 0, r0_ = 0;
  };
};

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t q_start) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, H, T, Dh)");
  TORCH_CHECK(q.scalar_type() == at::kFloat, "q must be float32");
  TORCH_CHECK((k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16) && v.scalar_type() == k.scalar_type(),
              "k and v must be both float32 or both bfloat16");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "last dims must be contiguous");
  const int64_t heads = q.size(1), dim = q.size(3);
  TORCH_CHECK(k.size(1) == heads && v.size(1) == heads && k.size(3) == dim && v.size(3) == dim, "shape mismatch");
  TORCH_CHECK(k.size(2) >= q_start + q.size(2), "keys must reach the last query");
}

// (H, Tq) p_r, or null.
const float* row_scale_of(const c10::optional<at::Tensor>& prior_scale, int64_t heads, int64_t queries) {
  if (!prior_scale.has_value()) return nullptr;
  TORCH_CHECK(prior_scale->is_contiguous() && prior_scale->scalar_type() == at::kFloat && prior_scale->size(0) == heads &&
                  prior_scale->size(1) == queries,
              "prior scale must be (H, Tq) float32, contiguous");
  return prior_scale->data_ptr<float>();
}

template <class Stored, class Bias>
std::vector<at::Tensor> flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Bias& bias,
                                        int64_t q_start, bool skip) {
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), dim = q.size(3);
  std::vector<std::atomic<int64_t>> skipped(batch), visited(batch);  // per sequence of the batch
  for (int64_t b = 0; b < batch; ++b) skipped[b] = 0, visited[b] = 0;
  auto out = at::empty({batch, heads, queries, dim}, q.options());
  auto lse = at::empty({batch, heads, queries}, q.options());
  const float* q_data = q.data_ptr<float>();
  const Stored* k_data = k.data_ptr<Stored>();
  const Stored* v_data = v.data_ptr<Stored>();
  float* out_data = out.data_ptr<float>();
  float* lse_data = lse.data_ptr<float>();
  const int64_t q_block = query_block(queries);
  const int64_t n_blocks = (queries + q_block - 1) / q_block;

  // Tasks (a query block of one head) differ in cost: later blocks see more keys, and a
  // steep head skips most of its keys while a flat one skips none. A static split would
  // leave one thread with the expensive half, so threads take tasks from a shared
  // counter, the latest query blocks (the most keys) first.
  const int64_t n_tasks = batch * heads * n_blocks;
  std::atomic<int64_t> next_task{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> scores(q_block * kKeyBlock), acc(q_block * dim), top(q_block), total(q_block);
    typename Bias::Task task_bias(bias, q_block);
    BlockReader<Stored> key_reader(kKeyBlock, dim), value_reader(kKeyBlock, dim);
    for (int64_t task = next_task.fetch_add(1); task < n_tasks; task = next_task.fetch_add(1)) {
      const int64_t block = n_blocks - 1 - task / (batch * heads), b = (task / heads) % batch, h = task % heads;
      const int64_t r0 = block * q_block, rows = std::min(q_block, queries - r0);
      const int64_t first = q_start + r0;          // absolute position of the block's first query
      const int64_t visible = first + rows;        // keys 0 .. visible - 1 are seen by some row
      const float* qp = q_data + b * q.stride(0) + h * q.stride(1) + r0 * q.stride(2);
      const Stored* kp = k_data + b * k.stride(0) + h * k.stride(1);
      const Stored* vp = v_data + b * v.stride(0) + h * v.stride(1);
      std::fill(top.begin(), top.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(total.begin(), total.begin() + rows, 0.f);
      std::fill(acc.begin(), acc.begin() + rows * dim, 0.f);
      task_bias.begin(h, r0, rows, first, qp, q.stride(2), dim);
      int64_t local_skipped = 0, local_visited = 0;

      for (int64_t j0 = (visible - 1) / kKeyBlock * kKeyBlock; j0 >= 0; j0 -= kKeyBlock) {  // nearest first
        const int64_t cols = std::min(kKeyBlock, visible - j0);
        ++local_visited;
        const auto [keys, key_stride] = key_reader.read(kp, k.stride(2), j0, cols);
        if (skip && j0 + cols <= first &&  // wholly in the past of every row: may skip
            task_bias.negligible(keys, key_stride, dim, j0, cols, top.data())) {
          ++local_skipped;
          continue;
        }
        // scores (rows x cols, row-major) = q_block . k_block^T
        gemm(true, cols, rows, dim, keys, key_stride, qp, q.stride(2), 0.f, scores.data(), cols);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = scores.data() + r * cols;
          const int64_t i = first + r;
          const int64_t n = std::min(cols, i - j0 + 1);  // keys of this block at or before i
          if (n <= 0) {
            std::fill(row, row + cols, 0.f);
            continue;
          }
          const float block_max = task_bias.add(row, r, i, j0, n);
          const float new_top = std::max(top[r], block_max);
          const float decay = std::exp(top[r] - new_top);  // 0 on the first block (top = -inf)
          const float sum = exp_and_sum(row, new_top, n);
          std::fill(row + n, row + cols, 0.f);
          total[r] = total[r] * decay + sum;
          top[r] = new_top;
          if (decay != 1.f) {
            float* a = acc.data() + r * dim;
            at::vec::map([decay](fVec x) { return x * fVec(decay); }, a, a, dim);
          }
        }
        // acc (rows x dim) += weights (rows x cols) . v_block (cols x dim)
        const auto [values, value_stride] = value_reader.read(vp, v.stride(2), j0, cols);
        gemm(false, dim, rows, cols, values, value_stride, scores.data(), cols, 1.f, acc.data(), dim);
      }
      skipped[b] += local_skipped;
      visited[b] += local_visited;
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.f / total[r];
        float* o = out_data + ((b * heads + h) * queries + r0 + r) * dim;
        const float* a = acc.data() + r * dim;
        at::vec::map([inv](fVec x) { return x * fVec(inv); }, o, a, dim);
        lse_data[(b * heads + h) * queries + r0 + r] = top[r] + std::log(total[r]);
      }
    }
  });
  auto counts = at::empty({batch, 2}, at::kLong);  // (skipped, visited) per sequence
  auto count = counts.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    count[b][0] = skipped[b].load();
    count[b][1] = visited[b].load();
  }
  return {out, lse, counts};
}

// flash_attention for the cache's storage type.
template <class Bias>
std::vector<at::Tensor> run_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Bias& bias,
                                            int64_t q_start, bool skip) {
  if (k.scalar_type() == at::kBFloat16) return flash_attention<c10::BFloat16>(q, k, v, bias, q_start, skip);
  return flash_attention<float>(q, k, v, bias, q_start, skip);
}

}  // namespace

std::vector<at::Tensor> bam_attention(
    const at::Tensor& q,  // (B, H, Tq, Dh) float32, times 1/sqrt(Dh) (and c_h(i) if no prior_scale); last dim contiguous
    const at::Tensor& k,  // (B, H, Tk, Dh) float32 or bfloat16; last dim contiguous
    const at::Tensor& v,  // (B, H, Tk, Dh) as k
    const c10::optional<at::Tensor>& prior_rev,    // (H, L) float32 contiguous, or none
    const c10::optional<at::Tensor>& prior_scale,  // (H, Tq) float32 contiguous, or none (= 1)
    int64_t q_start,
    bool skip) {  // certified skipping (--block-skip auto)
  check_qkv(q, k, v, q_start);
  const int64_t heads = q.size(1), queries = q.size(2);
  DistancePrior prior;
  if (prior_rev.has_value()) {
    TORCH_CHECK(prior_rev->is_contiguous() && prior_rev->scalar_type() == at::kFloat, "prior must be float32, contiguous");
    TORCH_CHECK(prior_rev->size(0) == heads && prior_rev->size(1) >= q_start + queries, "prior line too short");
    prior.line = prior_rev->data_ptr<float>();
    prior.length = prior_rev->size(1);
  }
  prior.row_scale = row_scale_of(prior_scale, heads, queries);
  prior.queries = queries;
  return run_flash_attention(q, k, v, prior, q_start, skip);
}

std::vector<at::Tensor> piecewise_attention(
    const at::Tensor& q,            // (B, H, Tq, Dh) float32, times 1/sqrt(Dh) (and c_h(i) if no prior_scale)
    const at::Tensor& k,            // (B, H, Tk, Dh) float32 or bfloat16; last dim contiguous
    const at::Tensor& v,            // (B, H, Tk, Dh) as k
    const at::Tensor& psi_rev,      // (L,) float32: psi(L - 1 - t), non-decreasing in the distance
    const at::Tensor& query_norm,   // (Tq,) float32, > 0
    const at::Tensor& breaks,       // (m,) float32, sorted
    const at::Tensor& slopes,       // (H, m + 1) float32
    const at::Tensor& offsets,      // (H, m + 1) float32
    const c10::optional<at::Tensor>& prior_scale,  // (H, Tq) float32 contiguous, or none (= 1)
    int64_t q_start) {
  check_qkv(q, k, v, q_start);
  const int64_t heads = q.size(1), queries = q.size(2), m = breaks.numel();
  for (const at::Tensor* t : {&psi_rev, &query_norm, &breaks, &slopes, &offsets}) {
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kFloat, "the pieces must be float32, contiguous");
  }
  TORCH_CHECK(psi_rev.dim() == 1 && psi_rev.size(0) >= q_start + queries, "psi line too short");
  TORCH_CHECK(query_norm.dim() == 1 && query_norm.size(0) == queries, "query norm must be (Tq,)");
  TORCH_CHECK(breaks.dim() == 1 && slopes.dim() == 2 && slopes.size(0) == heads && slopes.size(1) == m + 1 &&
                  offsets.sizes() == slopes.sizes(),
              "slopes and offsets must be (H, m + 1) for m breakpoints");
  PiecewisePrior prior;
  prior.psi = psi_rev.data_ptr<float>();
  prior.length = psi_rev.size(0);
  prior.norm = query_norm.data_ptr<float>();
  prior.breaks = breaks.data_ptr<float>();
  prior.slopes = slopes.data_ptr<float>();
  prior.offsets = offsets.data_ptr<float>();
  prior.pieces = m + 1;
  prior.row_scale = row_scale_of(prior_scale, heads, queries);
  prior.queries = queries;
  return run_flash_attention(q, k, v, prior, q_start, false);  // FIRE: no table bounds a block's bias
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bam_attention", &bam_attention, "causal attention with a distance prior and SSMax (CPU)");
  m.def("piecewise_attention", &piecewise_attention,
        "causal attention with a piecewise-linear bias of a per-query-scaled distance (FIRE) and SSMax (CPU)");
}
