// bamctl's CPU attention kernel: causal flash attention with a distance prior and SSMax.
//
// For query row r (absolute position i = q_start + r) and key j <= i it computes
//     l_ij = q_i . k_j + p_r * prior[h, i - j]
// where the caller has folded 1/sqrt(Dh) and SSMax's per-row factor c_h(i) into q, and
// p_r is the prior's per-row multiplier (c_h(i) when SSMax scales the prior too, else 1).
// The prior is read on the fly from one line per head, reversed so that consecutive keys
// are consecutive floats: prior_rev[h, t] = b_h(L - 1 - t), i.e. b_h(i - j) sits at
// t = L - 1 - i + j. Nothing of size (queries x keys) is ever built.
//
// Exact skipping: a key block that lies wholly in the past of a query block is skipped
// when, for every query r of the block, an upper bound of its logits there,
//     |q_r| * max_j |k_j| + p_r * (max or min of the prior over the block),
// lies more than kSkipMargin below the largest logit r has already seen. Its softmax
// weights would be below exp(-110) ~ 1e-48 of that logit's: exactly 0 in float32, as in
// the reference. Key blocks are walked nearest first so that this largest logit is
// known early; a steep prior (most BAM heads learn one) then never reads the far past.
//
// Tiling follows the usual CPU flash-attention layout: blocks of queries in parallel,
// key blocks in sequence with an online softmax (running max and sum), the two products
// as BLAS calls; keys in a query's future are never visited. The BLAS is the one torch
// itself links (its exported Fortran `sgemm_`), so nothing else needs installing.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <utility>
#include <cmath>
#include <limits>
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

constexpr int64_t kKeyBlock = 512;
constexpr float kSkipMargin = 110.f;  // exp(-110) underflows float32 to 0

int64_t query_block(int64_t queries) {
  return queries >= 768 ? 256 : (queries >= 192 ? 64 : 32);
}

// row[0:n] += scale * prior[0:n]; returns max(row[0:n]).
float add_prior_and_max(float* row, const float* prior, float scale, int64_t n) {
  const fVec vscale(scale);
  fVec vmax(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + fVec::size() <= n; j += fVec::size()) {
    fVec x = fVec::loadu(row + j);
    if (prior != nullptr) {
      x = at::vec::fmadd(fVec::loadu(prior + j), vscale, x);
      x.store(row + j);
    }
    vmax = at::vec::maximum(vmax, x);
  }
  float best = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, vmax);
  for (; j < n; ++j) {
    if (prior != nullptr) row[j] += scale * prior[j];
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

// Whether key block [j0, j0 + cols), wholly in the past of the `rows` queries of a block,
// can be skipped exactly: for every row r an upper bound of its logits over the block,
//     |q_r| * max_j |k_j| + p_r * (max or min of the prior entries the block's rows read),
// lies more than kSkipMargin below top[r], the largest logit r has already seen, so every
// weight there would be exactly 0 in float32. `prior` points at the first of the
// rows + cols - 1 prior entries the block reads (t = line - 1 - i + j over its rows and
// keys); `row_scale` at the rows' prior multipliers p_r (null: 1).
bool block_is_negligible(const float* keys, int64_t key_stride, int64_t dim, int64_t j0, int64_t cols,
                         const float* prior, int64_t rows, const float* q_norm, const float* row_scale,
                         const float* top) {
  float key_max = 0.f;
  for (int64_t j = 0; j < cols; ++j) key_max = std::max(key_max, norm(keys + (j0 + j) * key_stride, dim));
  const auto [prior_min, prior_max] = min_max(prior, rows + cols - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const float p = row_scale ? row_scale[r] : 1.f;
    const float bound = q_norm[r] * key_max + (p >= 0.f ? p * prior_max : p * prior_min);
    const float slack = 1e-5f * (std::fabs(bound) + std::fabs(top[r]));  // rounding in both
    if (!(bound + kSkipMargin + slack < top[r])) return false;
  }
  return true;
}

}  // namespace

std::vector<at::Tensor> bam_attention(
    const at::Tensor& q,  // (B, H, Tq, Dh) float32, scaled; last dim contiguous
    const at::Tensor& k,  // (B, H, Tk, Dh) float32; last dim contiguous
    const at::Tensor& v,  // (B, H, Tk, Dh) float32; last dim contiguous
    const c10::optional<at::Tensor>& prior_rev,    // (H, L) float32 contiguous, or none
    const c10::optional<at::Tensor>& prior_scale,  // (H, Tq) float32 contiguous, or none (= 1)
    int64_t q_start) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, H, T, Dh)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "q, k, v must be float32");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "last dims must be contiguous");
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), dim = q.size(3);
  const int64_t keys = k.size(2);
  TORCH_CHECK(k.size(1) == heads && v.size(1) == heads && k.size(3) == dim && v.size(3) == dim, "shape mismatch");
  TORCH_CHECK(keys >= q_start + queries, "keys must reach the last query");

  const float* prior = nullptr;
  int64_t line = 0;
  if (prior_rev.has_value()) {
    TORCH_CHECK(prior_rev->is_contiguous() && prior_rev->scalar_type() == at::kFloat, "prior must be float32, contiguous");
    TORCH_CHECK(prior_rev->size(0) == heads && prior_rev->size(1) >= q_start + queries, "prior line too short");
    prior = prior_rev->data_ptr<float>();
    line = prior_rev->size(1);
  }
  const float* row_scale = nullptr;
  if (prior_scale.has_value()) {
    TORCH_CHECK(prior_scale->is_contiguous() && prior_scale->size(0) == heads && prior_scale->size(1) == queries,
                "prior scale must be (H, Tq), contiguous");
    row_scale = prior_scale->data_ptr<float>();
  }

  std::atomic<int64_t> skipped{0}, visited{0};
  auto out = at::empty({batch, heads, queries, dim}, q.options());
  auto lse = at::empty({batch, heads, queries}, q.options());
  const float* q_data = q.data_ptr<float>();
  const float* k_data = k.data_ptr<float>();
  const float* v_data = v.data_ptr<float>();
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
    std::vector<float> scores(q_block * kKeyBlock), acc(q_block * dim), top(q_block), total(q_block), q_norm(q_block);
    for (int64_t task = next_task.fetch_add(1); task < n_tasks; task = next_task.fetch_add(1)) {
      const int64_t block = n_blocks - 1 - task / (batch * heads), b = (task / heads) % batch, h = task % heads;
      const int64_t r0 = block * q_block, rows = std::min(q_block, queries - r0);
      const int64_t first = q_start + r0;          // absolute position of the block's first query
      const int64_t visible = first + rows;        // keys 0 .. visible - 1 are seen by some row
      const float* qp = q_data + b * q.stride(0) + h * q.stride(1) + r0 * q.stride(2);
      const float* kp = k_data + b * k.stride(0) + h * k.stride(1);
      const float* vp = v_data + b * v.stride(0) + h * v.stride(1);
      std::fill(top.begin(), top.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(total.begin(), total.begin() + rows, 0.f);
      std::fill(acc.begin(), acc.begin() + rows * dim, 0.f);

      if (prior != nullptr) {
        for (int64_t r = 0; r < rows; ++r) q_norm[r] = norm(qp + r * q.stride(2), dim);
      }
      int64_t local_skipped = 0, local_visited = 0;

      for (int64_t j0 = (visible - 1) / kKeyBlock * kKeyBlock; j0 >= 0; j0 -= kKeyBlock) {  // nearest first
        const int64_t cols = std::min(kKeyBlock, visible - j0);
        ++local_visited;
        if (prior != nullptr && j0 + cols <= first &&  // wholly in the past of every row: may skip
            block_is_negligible(kp, k.stride(2), dim, j0, cols, prior + h * line + (line - visible + j0), rows,
                                q_norm.data(), row_scale ? row_scale + h * queries + r0 : nullptr, top.data())) {
          ++local_skipped;
          continue;
        }
        // scores (rows x cols, row-major) = q_block . k_block^T
        gemm(true, cols, rows, dim, kp + j0 * k.stride(2), k.stride(2), qp, q.stride(2), 0.f, scores.data(), cols);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = scores.data() + r * cols;
          const int64_t i = first + r;
          const int64_t n = std::min(cols, i - j0 + 1);  // keys of this block at or before i
          if (n <= 0) {
            std::fill(row, row + cols, 0.f);
            continue;
          }
          const float* prior_row = prior ? prior + h * line + (line - 1 - i + j0) : nullptr;
          const float scale = row_scale ? row_scale[h * queries + r0 + r] : 1.f;
          const float block_max = add_prior_and_max(row, prior_row, scale, n);
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
        gemm(false, dim, rows, cols, vp + j0 * v.stride(2), v.stride(2), scores.data(), cols, 1.f, acc.data(), dim);
      }
      skipped += local_skipped;
      visited += local_visited;
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.f / total[r];
        float* o = out_data + ((b * heads + h) * queries + r0 + r) * dim;
        const float* a = acc.data() + r * dim;
        at::vec::map([inv](fVec x) { return x * fVec(inv); }, o, a, dim);
        lse_data[(b * heads + h) * queries + r0 + r] = top[r] + std::log(total[r]);
      }
    }
  });
  return {out, lse, at::tensor({skipped.load(), visited.load()}, at::kLong)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bam_attention", &bam_attention, "causal attention with a distance prior and SSMax (CPU)");
}
