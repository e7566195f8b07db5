// Hand-derived potential and gradient of a Bayesian MLP, and the NUTS transition and MCLMC step
// over it, for pyrobnn's samplers (pyrobnn/infer/core/native/__init__.py builds and loads this file).
//
// The codes, coefficients and thresholds shared with the Python code come from the header
// pyrobnn_constants.h, which the build generates from the Python definitions
// (pyrobnn/infer/core/native/constants.py): none is written here.
//
// The potential is U(z) = -log p(y | x, w) - log p(w) - log|J| of pyrobnn.infer.core.potential.
// FlatPotential for a BayesianModel whose network is a stack of nn.Linear layers with
// element-wise activations (a fixed input map is applied to x_t by the caller; a constant output
// offset, out_offset, is added here), Normal priors and a Gaussian (fixed or latent noise scale),
// heteroscedastic Gaussian, categorical or Bernoulli likelihood. The gradient is derived by hand
// (backpropagation written out), and tests/test_native.py checks value and gradient against
// torch.autograd on random models.
//
// Layout: activations are stored feature-major (width x N), so that every loop over the data
// points is contiguous and vectorizes; a chain is processed at a time, start to end, so that a
// chain whose NUTS trajectory ends early stops costing anything.
//
// The samplers take their random numbers from the caller (drawn with torch's generator), in the
// same layout as the torch path of pyrobnn/infer/mcmc/nuts_kernel.py and mclmc_kernel.py, so both
// paths follow one random stream.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "pyrobnn_constants.h"

// glibc's vector math library (libmvec, x86-64 Linux): these functions declared as having SIMD
// variants, the activation loops marked `omp simd` below evaluate erf, exp, sin, cos and tanh 4
// to 16 points at a time instead of one (glibc documents its vector variants within 4 ulp of the
// scalar functions). The build defines PYROBNN_VECTOR_MATH and links libmvec where both exist
// (build.py), and builds without them elsewhere, where the same loops call the scalar functions.
#if defined(PYROBNN_VECTOR_MATH)
extern "C" {
__attribute__((simd("notinbranch"))) double erf(double) noexcept;
__attribute__((simd("notinbranch"))) double exp(double) noexcept;
__attribute__((simd("notinbranch"))) double sin(double) noexcept;
__attribute__((simd("notinbranch"))) double cos(double) noexcept;
__attribute__((simd("notinbranch"))) double tanh(double) noexcept;
__attribute__((simd("notinbranch"))) float erff(float) noexcept;
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float sinf(float) noexcept;
__attribute__((simd("notinbranch"))) float cosf(float) noexcept;
}
#endif

namespace {

// ------------------------------------------------------------------------------------ model
struct Model {
    int64_t num_layers;
    const int64_t* layers;  // num_layers x 7: in, out, activation, w_off, b_off, wc_off, bc_off
    const void* layer_prec;  // num_layers x 2 (T): prior precision of the weight, of the bias
    const void* constants;   // (T) values of the layers' non-random parameters
    int64_t num_points;
    const void* x_t;  // (T) in_0 x N, the inputs feature-major
    const void* y_t;  // (T) d x N, regression targets feature-major
    const int64_t* labels;  // N, class labels (categorical)
    int64_t likelihood;  // a LikelihoodKind
    int64_t target_dim;  // d (regression), classes (categorical)
    double lik_a, lik_b;  // fixed scale | min and max scale
    int64_t noise_off;    // index of the unconstrained noise scale in z (likelihood 1)
    int64_t noise_prior;  // a NoisePrior: LogNormal(a, b), HalfNormal(a), HalfCauchy(a), Gamma(a, b), Exponential(a)
    double noise_a, noise_b;
    double constant;  // the potential's constant terms (prior normalizers)
    int64_t dim;
    int64_t max_width;
    const void* out_offset;  // (T) a constant added to each output of the last layer (an OutputMean), or null
};

constexpr double HALF_LOG_2PI = 0.91893853320467274178;
constexpr double LN2 = 0.69314718055994530942;
constexpr double PI = 3.14159265358979323846;

// tanh as x P(x^2) / Q(x^2) (pyrobnn/models/rational_tanh.py), by Horner's rule from the highest
// power: float32 only, where it is within 3.4e-7 of tanh and vectorizes; float64 uses std::tanh
inline float tanh_of(float x) {
    const float c = x < -TANH_CLAMP ? -TANH_CLAMP : (x > TANH_CLAMP ? TANH_CLAMP : x);
    const float s = c * c;
    float p = TANH_P[TANH_P_DEGREE];
    for (int i = TANH_P_DEGREE - 1; i >= 0; --i) p = p * s + TANH_P[i];
    float q = TANH_Q[TANH_Q_DEGREE];
    for (int i = TANH_Q_DEGREE - 1; i >= 0; --i) q = q * s + TANH_Q[i];
    float y = c * p / q;
    y = y < -1.0f ? -1.0f : (y > 1.0f ? 1.0f : y);
    return std::fabs(x) >= TANH_CLAMP ? std::copysign(1.0f, x) : y;
}
inline double tanh_of(double x) { return std::tanh(x); }

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

template <typename T>
inline T total(const T* a, int64_t n) {
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += a[i];
    return s;
}

template <typename T>
void activate(int64_t act, const T* a, T* h, int64_t n) {
    switch (act) {
        case ACT_TANH:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) h[i] = tanh_of(a[i]);
            break;
        case ACT_RELU:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) h[i] = a[i] > T(0) ? a[i] : T(0);
            break;
        case ACT_GELU:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) h[i] = T(0.5) * a[i] * (T(1) + std::erf(a[i] * T(0.70710678118654752440)));
            break;
        case ACT_SIGMOID:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) h[i] = T(1) / (T(1) + std::exp(-a[i]));
            break;
        case ACT_ERF:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) h[i] = std::erf(a[i]);
            break;
        case ACT_COS:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) h[i] = std::cos(a[i]);
            break;
        default:
            std::memcpy(h, a, sizeof(T) * n);
    }
}

// delta *= act'(a), the activation's derivative at the pre-activation a (output h)
template <typename T>
void times_derivative(int64_t act, const T* a, const T* h, T* delta, int64_t n) {
    switch (act) {
        case ACT_TANH:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) delta[i] *= T(1) - h[i] * h[i];
            break;
        case ACT_RELU:  // torch: the gradient passes where the output is positive
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) delta[i] = h[i] > T(0) ? delta[i] : T(0);
            break;
        case ACT_GELU:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) {
                T cdf = T(0.5) * (T(1) + std::erf(a[i] * T(0.70710678118654752440)));
                T pdf = std::exp(T(-0.5) * a[i] * a[i]) * T(0.39894228040143267794);
                delta[i] *= cdf + a[i] * pdf;
            }
            break;
        case ACT_SIGMOID:
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) delta[i] *= h[i] * (T(1) - h[i]);
            break;
        case ACT_ERF:  // erf'(a) = 2 / sqrt(pi) exp(-a^2)
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) delta[i] *= T(1.12837916709551257390) * std::exp(-a[i] * a[i]);
            break;
        case ACT_COS:  // cos'(a) = -sin(a)
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) delta[i] *= -std::sin(a[i]);
            break;
        default:
            break;
    }
}

// ------------------------------------------------------------------------- dense products
// A layer's three products (the forward pass, the weights' gradient, the delta passed back) as
// one register-blocked kernel: C = init + A B, with C (M x N) and B (K x N) row-major and A read
// at a[r * ar + k * ak], so that one kernel reads W, W^T or the deltas in place. A tile of MR rows
// and NR columns (two vector registers wide) keeps its MR * NR sums in registers through the whole
// k loop: each step loads one row of B and broadcasts MR entries of A, where the one-row updates
// this replaces loaded and stored a row of C per multiply-add. Every entry of C is assigned, never
// accumulated, so the last tile of a row or column that does not divide evenly overlaps the one
// before it and recomputes the same values.
#if defined(__AVX512F__)
constexpr int64_t VECTOR_BYTES = 64;
#else
constexpr int64_t VECTOR_BYTES = 32;
#endif

template <typename T, int MR, int NR>
inline void tile(const T* a, int64_t ar, int64_t ak, const T* b, int64_t ldb, int64_t K, const T* init, T* c, int64_t ldc) {
    T acc[MR][NR];
    for (int r = 0; r < MR; ++r) {
        const T start = init ? init[r] : T(0);
#pragma omp simd
        for (int j = 0; j < NR; ++j) acc[r][j] = start;
    }
    for (int64_t k = 0; k < K; ++k) {
        const T* bk = b + k * ldb;
        for (int r = 0; r < MR; ++r) {
            const T ark = a[r * ar + k * ak];
#pragma omp simd
            for (int j = 0; j < NR; ++j) acc[r][j] += ark * bk[j];
        }
    }
    for (int r = 0; r < MR; ++r) {
#pragma omp simd
        for (int j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
    }
}

// the column block of C at j, NR wide, over every row (tiles of 4 rows, else one at a time)
template <typename T, int NR>
void product_columns(const T* a, int64_t ar, int64_t ak, const T* b, int64_t ldb, int64_t M, int64_t K, const T* init, T* c,
                     int64_t ldc, int64_t j) {
    constexpr int MR = 4;
    if (M < MR) {
        for (int64_t r = 0; r < M; ++r) tile<T, 1, NR>(a + r * ar, ar, ak, b + j, ldb, K, init ? init + r : nullptr, c + r * ldc + j, ldc);
        return;
    }
    for (int64_t r = 0;; r += MR) {
        if (r + MR > M) r = M - MR;  // the last tile overlaps the one before
        tile<T, MR, NR>(a + r * ar, ar, ak, b + j, ldb, K, init ? init + r : nullptr, c + r * ldc + j, ldc);
        if (r + MR >= M) break;
    }
}

// C = init + A B for N under a vector's width: tiles W columns wide, the widest W <= N (halving
// down to 4; two tiles overlap as above), and one product at a time only below 4 columns. A float32
// layer over 8-15 points (a vector holds 16 under AVX-512) took the one-at-a-time loop before: its
// gradient 2.7x a float64 one's at 10 points, half of it at 16
template <typename T, int W>
void product_narrow(const T* a, int64_t ar, int64_t ak, const T* b, int64_t ldb, int64_t M, int64_t K, int64_t N, const T* init, T* c,
                    int64_t ldc) {
    if constexpr (W >= 4) {
        if (N >= W) {
            product_columns<T, W>(a, ar, ak, b, ldb, M, K, init, c, ldc, 0);
            if (N > W) product_columns<T, W>(a, ar, ak, b, ldb, M, K, init, c, ldc, N - W);
        } else {
            product_narrow<T, W / 2>(a, ar, ak, b, ldb, M, K, N, init, c, ldc);
        }
    } else {
        for (int64_t r = 0; r < M; ++r)
            for (int64_t j = 0; j < N; ++j) {
                T sum = init ? init[r] : T(0);
                for (int64_t k = 0; k < K; ++k) sum += a[r * ar + k * ak] * b[k * ldb + j];
                c[r * ldc + j] = sum;
            }
    }
}

// C (M x N, rows ldc apart) = init (one value per row, or none) + A B, as described above
template <typename T>
void product(const T* a, int64_t ar, int64_t ak, const T* b, int64_t ldb, int64_t M, int64_t K, int64_t N, const T* init, T* c,
             int64_t ldc) {
    constexpr int V = int(VECTOR_BYTES / sizeof(T)), NR = 2 * V;
    if (N >= NR) {
        for (int64_t j = 0;; j += NR) {
            if (j + NR > N) j = N - NR;
            product_columns<T, NR>(a, ar, ak, b, ldb, M, K, init, c, ldc, j);
            if (j + NR >= N) break;
        }
    } else {
        product_narrow<T, V>(a, ar, ak, b, ldb, M, K, N, init, c, ldc);
    }
}

// C (M x P, rows ldc apart) = A B^T, A (M x K) and B (P x K) row-major: the weights' gradient
// over many points, delta h^T with both in their layout. A tile of MR x PR entries keeps one
// vector of partial sums each through the k loop (each step loads MR + PR vectors for MR * PR
// multiply-adds, where a dot product per entry loads two per multiply-add), summed across the
// vector at the end; the last tile of a row or column overlaps as in `product`.
#if defined(__AVX512F__)
constexpr int DOT_MR = 4;
#else
constexpr int DOT_MR = 2;  // 8 of the 16 vector registers for the sums
#endif

template <typename T, int MR, int PR>
inline void dot_tile(const T* a, int64_t lda, const T* b, int64_t ldb, int64_t K, T* c, int64_t ldc) {
    constexpr int V = int(VECTOR_BYTES / sizeof(T));
    T acc[MR][PR][V];
    for (int r = 0; r < MR; ++r)
        for (int p = 0; p < PR; ++p)
#pragma omp simd
            for (int v = 0; v < V; ++v) acc[r][p][v] = T(0);
    int64_t k = 0;
    for (; k + V <= K; k += V)
        for (int r = 0; r < MR; ++r)
            for (int p = 0; p < PR; ++p)
#pragma omp simd
                for (int v = 0; v < V; ++v) acc[r][p][v] += a[r * lda + k + v] * b[p * ldb + k + v];
    for (int r = 0; r < MR; ++r)
        for (int p = 0; p < PR; ++p) {
            T sum = T(0);
            for (int v = 0; v < V; ++v) sum += acc[r][p][v];
            for (int64_t t = k; t < K; ++t) sum += a[r * lda + t] * b[p * ldb + t];
            c[r * ldc + p] = sum;
        }
}

template <typename T>
void dot_product(const T* a, int64_t lda, const T* b, int64_t ldb, int64_t M, int64_t P, int64_t K, T* c, int64_t ldc) {
    constexpr int MR = DOT_MR, PR = 4;
    if (M < MR || P < PR) {
        for (int64_t r = 0; r < M; ++r)
            for (int64_t p = 0; p < P; ++p) c[r * ldc + p] = dot(a + r * lda, b + p * ldb, K);
        return;
    }
    for (int64_t r = 0;; r += MR) {
        if (r + MR > M) r = M - MR;
        for (int64_t p = 0;; p += PR) {
            if (p + PR > P) p = P - PR;
            dot_tile<T, MR, PR>(a + r * lda, lda, b + p * ldb, ldb, K, c + r * ldc + p, ldc);
            if (p + PR >= P) break;
        }
        if (r + MR >= M) break;
    }
}

// workspace for one chain: pre-activations and activations of every layer, and two delta rows
template <typename T>
struct Work {
    std::vector<T> a, h, d0, d1, hin_t, init;  // hin_t: a layer's input point-major (N x in); init: its biases
    std::vector<int64_t> row;  // offset of each layer's rows in a and h
    explicit Work(const Model& m) {
        int64_t total_rows = 0;
        for (int64_t l = 0; l < m.num_layers; ++l) {
            row.push_back(total_rows);
            total_rows += m.layers[7 * l + 1];
        }
        a.resize(total_rows * m.num_points);
        h.resize(total_rows * m.num_points);
        d0.resize(m.max_width * m.num_points);
        d1.resize(m.max_width * m.num_points);
        hin_t.resize(m.max_width * m.num_points);
        init.resize(m.max_width);
    }
};

// the noise scale's prior with the log-Jacobian of sigma = exp(u): value and d/du
template <typename T>
void noise_prior(const Model& m, T u, T& value, T& grad) {
    T s = std::exp(u);
    T a = T(m.noise_a), b = T(m.noise_b);
    switch (m.noise_prior) {
        case NP_LOGNORMAL: {  // LogNormal(a, b): the log-Jacobian cancels the 1/sigma of the density
            T t = (u - a) / b;
            value = T(-0.5) * t * t - std::log(b) - T(HALF_LOG_2PI);
            grad = -t / b;
            break;
        }
        case NP_HALFNORMAL: {  // HalfNormal(a)
            T t = s / a;
            value = T(LN2) - T(HALF_LOG_2PI) - std::log(a) - T(0.5) * t * t + u;
            grad = T(1) - t * t;
            break;
        }
        case NP_HALFCAUCHY: {  // HalfCauchy(a)
            T t = s / a;
            value = T(LN2) - std::log(T(PI)) - std::log(a) - std::log1p(t * t) + u;
            grad = T(1) - T(2) * t * t / (T(1) + t * t);
            break;
        }
        case NP_GAMMA: {  // Gamma(a, rate b)
            value = a * std::log(b) - std::lgamma(a) + a * u - b * s;
            grad = a - b * s;
            break;
        }
        default: {  // NP_EXPONENTIAL: Exponential(rate a)
            value = std::log(a) - a * s + u;
            grad = T(1) - a * s;
        }
    }
}

// U(z) and dU/dz for one chain
template <typename T>
T value_and_grad(const Model& m, const T* z, T* g, Work<T>& w) {
    const int64_t N = m.num_points;
    const T* prec = static_cast<const T*>(m.layer_prec);
    const T* cw = static_cast<const T*>(m.constants);
    const T* offset = static_cast<const T*>(m.out_offset);
    std::memset(g, 0, sizeof(T) * m.dim);
    T U = T(m.constant);
    // ---- forward
    for (int64_t l = 0; l < m.num_layers; ++l) {
        const int64_t* L = m.layers + 7 * l;
        const int64_t in = L[0], out = L[1], act = L[2];
        const T* W = L[3] >= 0 ? z + L[3] : cw + L[5];
        const T* b = L[4] >= 0 ? z + L[4] : (L[4] == -1 ? cw + L[6] : nullptr);
        const T* hin = l == 0 ? static_cast<const T*>(m.x_t) : w.h.data() + w.row[l - 1] * N;
        const T* shift = l == m.num_layers - 1 ? offset : nullptr;  // constant, so the gradient is unchanged
        T* A = w.a.data() + w.row[l] * N;
        T* init = w.init.data();
        for (int64_t o = 0; o < out; ++o) init[o] = (b ? b[o] : T(0)) + (shift ? shift[o] : T(0));
        product(W, in, int64_t(1), hin, N, out, in, N, init, A, N);  // A = b + W h
        activate(act, A, w.h.data() + w.row[l] * N, out * N);
        // Normal prior on the random blocks (its gradient is added in the backward pass)
        if (L[3] >= 0) U += T(0.5) * prec[2 * l] * dot(z + L[3], z + L[3], out * in);
        if (L[4] >= 0) U += T(0.5) * prec[2 * l + 1] * dot(z + L[4], z + L[4], out);
    }
    // ---- likelihood: U -= log p(y | f), delta = dU/df (width x N)
    const int64_t last = m.num_layers - 1;
    const int64_t out_last = m.layers[7 * last + 1];
    const T* F = w.h.data() + w.row[last] * N;
    T* delta = w.d0.data();
    const T* Y = static_cast<const T*>(m.y_t);
    const int64_t d = m.target_dim;
    switch (m.likelihood) {
        case L_GAUSSIAN:
        case L_GAUSSIAN_LATENT: {
            T sigma = m.likelihood == L_GAUSSIAN ? T(m.lik_a) : std::exp(z[m.noise_off]);
            T inv_var = T(1) / (sigma * sigma);
            T ss = 0;
            for (int64_t k = 0; k < d * N; ++k) {
                T r = Y[k] - F[k];
                ss += r * r;
                delta[k] = -r * inv_var;
            }
            U += T(0.5) * ss * inv_var + T(d * N) * (std::log(sigma) + T(HALF_LOG_2PI));
            if (m.likelihood == L_GAUSSIAN_LATENT) {
                T pv, pg;
                noise_prior(m, z[m.noise_off], pv, pg);
                U -= pv;
                // dU/du through sigma = exp(u): -(sum r^2 / sigma^2 - d N) - d(prior + log J)/du
                g[m.noise_off] += -(ss * inv_var - T(d * N)) - pg;
            }
            break;
        }
        case L_EXP:
        case L_SOFTPLUS: {
            const T lo = T(m.lik_a), hi = T(m.lik_b);
            T acc = 0;
            for (int64_t k = 0; k < d * N; ++k) {
                const T s = F[d * N + k];
                T sigma, dsigma;  // sigma and d sigma / ds
                if (m.likelihood == L_EXP) {
                    T e = std::exp(s);
                    sigma = e < lo ? lo : (e > hi ? hi : e);
                    dsigma = (e >= lo && e <= hi) ? e : T(0);  // torch's clamp passes the gradient at the bounds
                } else {
                    if (s > T(20)) {  // torch's softplus threshold
                        sigma = s + lo;
                        dsigma = T(1);
                    } else {
                        T e = std::exp(s);
                        sigma = std::log1p(e) + lo;
                        dsigma = e / (e + T(1));
                    }
                }
                T r = Y[k] - F[k];
                T t = r / sigma;
                acc += T(0.5) * t * t + std::log(sigma);
                delta[k] = -r / (sigma * sigma);
                delta[d * N + k] = (T(1) - t * t) / sigma * dsigma;
            }
            U += acc + T(d * N) * T(HALF_LOG_2PI);
            break;
        }
        case L_BERNOULLI: {  // independent Bernoulli per output on logits: -log p = softplus(f) - y f
            T acc = 0;
            for (int64_t k = 0; k < d * N; ++k) {
                const T f = F[k];
                acc += (f > T(0) ? f : T(0)) - f * Y[k] + std::log1p(std::exp(-std::fabs(f)));
                delta[k] = T(1) / (T(1) + std::exp(-f)) - Y[k];
            }
            U += acc;
            break;
        }
        default: {  // L_CATEGORICAL over out_last classes
            T acc = 0;
            for (int64_t n = 0; n < N; ++n) {
                T mx = -std::numeric_limits<T>::infinity();
                for (int64_t c = 0; c < out_last; ++c) mx = F[c * N + n] > mx ? F[c * N + n] : mx;
                T se = 0;
                for (int64_t c = 0; c < out_last; ++c) se += std::exp(F[c * N + n] - mx);
                T lse = mx + std::log(se);
                acc += lse - F[m.labels[n] * N + n];
                for (int64_t c = 0; c < out_last; ++c) delta[c * N + n] = std::exp(F[c * N + n] - lse);
                delta[m.labels[n] * N + n] -= T(1);
            }
            U += acc;
        }
    }
    // ---- backward
    constexpr int64_t V = VECTOR_BYTES / sizeof(T);
    T* next = w.d1.data();
    for (int64_t l = last; l >= 0; --l) {
        const int64_t* L = m.layers + 7 * l;
        const int64_t in = L[0], out = L[1], act = L[2];
        times_derivative(act, w.a.data() + w.row[l] * N, w.h.data() + w.row[l] * N, delta, out * N);
        const T* hin = l == 0 ? static_cast<const T*>(m.x_t) : w.h.data() + w.row[l - 1] * N;
        if (L[3] >= 0) {  // dU/dW = delta h^T + the prior's precision W
            T* gW = g + L[3];
            if (out < 4 || in < V || N >= 8 * V) {  // sums over the points, blocked
                dot_product(static_cast<const T*>(delta), N, hin, N, out, in, N, gW, in);
            } else {  // few points into a wide layer: the blocked product, through h point-major
                T* hin_t = w.hin_t.data();
                for (int64_t i = 0; i < in; ++i)
                    for (int64_t n = 0; n < N; ++n) hin_t[n * in + i] = hin[i * N + n];
                product(delta, N, int64_t(1), static_cast<const T*>(hin_t), in, out, N, in, static_cast<const T*>(nullptr), gW, in);
            }
            const T* Wz = z + L[3];
            const T p = prec[2 * l];
#pragma omp simd
            for (int64_t k = 0; k < out * in; ++k) gW[k] += p * Wz[k];
        }
        if (L[4] >= 0) {
            T* gb = g + L[4];
            const T* bz = z + L[4];
            for (int64_t o = 0; o < out; ++o) gb[o] = total(delta + o * N, N) + prec[2 * l + 1] * bz[o];
        }
        if (l == 0) break;
        const T* W = L[3] >= 0 ? z + L[3] : cw + L[5];
        product(W, int64_t(1), in, static_cast<const T*>(delta), N, in, out, N, static_cast<const T*>(nullptr), next, N);  // W^T delta
        T* swap = delta;
        delta = next;
        next = swap;
    }
    return U;
}

// ------------------------------------------------------------------------------------- NUTS
template <typename T>
inline T kinetic(const T* r, const T* inv_mass, int64_t D) {
    T s = 0;
    for (int64_t i = 0; i < D; ++i) s += r[i] * r[i] * inv_mass[i];
    return T(0.5) * s;
}

template <typename T>
inline bool is_turning(const T* inv_mass, const T* r_left, const T* r_right, const T* r_sum, int64_t D) {
    // Betancourt 2017, A.4.2: both end velocities against the momentum sum less half the end momenta
    T left = 0, right = 0;
    for (int64_t i = 0; i < D; ++i) {
        T rho = r_sum[i] - T(0.5) * (r_left[i] + r_right[i]);
        left += inv_mass[i] * r_left[i] * rho;
        right += inv_mass[i] * r_right[i] * rho;
    }
    return left <= T(0) || right <= T(0);
}

inline double logaddexp(double a, double b) {
    double hi = a > b ? a : b;
    if (hi == -std::numeric_limits<double>::infinity()) return hi;
    return hi + std::log1p(std::exp(-std::fabs(a - b)));
}

// one NUTS transition of one chain: pyrobnn.infer.mcmc.nuts_kernel.nuts_step for a single chain, with its
// uniforms given in one row (pyrobnn.infer.mcmc.nuts_kernel.transition_uniforms): a direction per depth, a
// merge uniform per depth, then the leaves' (depth j uses leaves 2^j - 1 .. 2^(j+1) - 2)
template <typename T>
void nuts_chain(const Model& m, T* z_io, T* u_io, T* g_io, const T* r0, const T* inv_mass, T step, int64_t max_depth,
                const T* uniforms, T* stats, Work<T>& w) {
    const T* dirs = uniforms;
    const T* merge_u = uniforms + max_depth;
    const T* leaf_u = uniforms + 2 * max_depth;
    const int64_t D = m.dim;
    const T max_delta = T(MAX_DELTA_ENERGY);
    std::vector<T> buf(D * (9 + 2 * max_depth));
    T* zl = buf.data(); T* rl = zl + D; T* gl = rl + D;
    T* zr = gl + D; T* rr = zr + D; T* gr = rr + D;
    T* z = gr + D; T* r = z + D; T* g = r + D;
    T* r_ckpt = g + D;             // max_depth x D
    T* r_sum_ckpt = r_ckpt + max_depth * D;
    std::vector<T> sub(4 * D), prop(2 * D), r_sum(D), sub_r_sum(D), block(D);
    T* sub_z = sub.data(); T* sub_g = sub_z + D; T* z_new = sub_g + D; T* g_new = z_new + D;
    T* pz = prop.data(); T* pg = pz + D;
    std::memcpy(zl, z_io, sizeof(T) * D); std::memcpy(zr, z_io, sizeof(T) * D); std::memcpy(pz, z_io, sizeof(T) * D);
    std::memcpy(rl, r0, sizeof(T) * D); std::memcpy(rr, r0, sizeof(T) * D); std::memcpy(r_sum.data(), r0, sizeof(T) * D);
    std::memcpy(gl, g_io, sizeof(T) * D); std::memcpy(gr, g_io, sizeof(T) * D); std::memcpy(pg, g_io, sizeof(T) * D);
    std::fill(r_ckpt, r_ckpt + 2 * max_depth * D, T(0));
    T pu = *u_io;
    const T h0 = pu + kinetic(r0, inv_mass, D);
    double log_w = 0.0, accept_sum = 0.0;
    int64_t n_steps = 0, depth = 0;
    bool diverging = false;
    for (int64_t j = 0; j < max_depth; ++j) {
        const bool forward = dirs[j] < T(0.5);
        const T signed_step = forward ? step : -step;
        std::memcpy(z, forward ? zr : zl, sizeof(T) * D);
        std::memcpy(r, forward ? rr : rl, sizeof(T) * D);
        std::memcpy(g, forward ? gr : gl, sizeof(T) * D);
        std::memcpy(sub_z, z, sizeof(T) * D);
        std::memcpy(sub_g, g, sizeof(T) * D);
        T sub_u = pu;
        double sub_log_w = -std::numeric_limits<double>::infinity();
        std::fill(sub_r_sum.begin(), sub_r_sum.end(), T(0));
        bool sub_bad = false;
        const int64_t n_leaves = int64_t(1) << j;
        const T* log_row = leaf_u + (n_leaves - 1);
        for (int64_t n = 0; n < n_leaves && !sub_bad; ++n) {
            // leapfrog
            for (int64_t i = 0; i < D; ++i) {
                r[i] -= T(0.5) * signed_step * g[i];
                z_new[i] = z[i] + signed_step * inv_mass[i] * r[i];
            }
            T u_new = value_and_grad(m, z_new, g_new, w);
            for (int64_t i = 0; i < D; ++i) r[i] -= T(0.5) * signed_step * g_new[i];
            T delta = u_new + kinetic(r, inv_mass, D) - h0;
            if (std::isnan(delta)) delta = std::numeric_limits<T>::infinity();
            const bool divergent = delta > max_delta;
            accept_sum += std::exp(double(-delta) < 0.0 ? double(-delta) : 0.0);
            n_steps += 1;
            const double new_sub_log_w = logaddexp(sub_log_w, double(-delta));
            if (std::log(double(log_row[n])) < double(-delta) - new_sub_log_w) {
                std::memcpy(sub_z, z_new, sizeof(T) * D);
                std::memcpy(sub_g, g_new, sizeof(T) * D);
                sub_u = u_new;
            }
            sub_log_w = new_sub_log_w;
            for (int64_t i = 0; i < D; ++i) sub_r_sum[i] += r[i];
            bool turning = false;
            if (n % 2 == 1) {  // check the sub-subtrees this leaf completes (NumPyro's leaf_idx_to_ckpt_idxs)
                int64_t idx_max = __builtin_popcountll(uint64_t(n >> 1));
                int64_t trailing = 0;
                while ((n >> trailing) & 1) ++trailing;
                for (int64_t k = idx_max - trailing + 1; k <= idx_max && !turning; ++k) {
                    const T* rc = r_ckpt + k * D;
                    const T* sc = r_sum_ckpt + k * D;
                    for (int64_t i = 0; i < D; ++i) block[i] = sub_r_sum[i] - sc[i] + rc[i];
                    turning = is_turning(inv_mass, rc, r, block.data(), D);
                }
            } else {  // an even leaf stores its checkpoint
                int64_t k = __builtin_popcountll(uint64_t(n >> 1));
                std::memcpy(r_ckpt + k * D, r, sizeof(T) * D);
                std::memcpy(r_sum_ckpt + k * D, sub_r_sum.data(), sizeof(T) * D);
            }
            sub_bad = turning || divergent;
            diverging = diverging || divergent;
            std::memcpy(z, z_new, sizeof(T) * D);
            std::memcpy(g, g_new, sizeof(T) * D);
        }
        // merge (biased progressive sampling) where the subtree is valid
        depth += 1;
        if (!sub_bad) {
            if (std::log(double(merge_u[j])) < sub_log_w - log_w) {
                std::memcpy(pz, sub_z, sizeof(T) * D);
                std::memcpy(pg, sub_g, sizeof(T) * D);
                pu = sub_u;
            }
            log_w = logaddexp(log_w, sub_log_w);
            std::memcpy(forward ? zr : zl, z, sizeof(T) * D);
            std::memcpy(forward ? rr : rl, r, sizeof(T) * D);
            std::memcpy(forward ? gr : gl, g, sizeof(T) * D);
            for (int64_t i = 0; i < D; ++i) r_sum[i] += sub_r_sum[i];
        }
        if (sub_bad || is_turning(inv_mass, rl, rr, r_sum.data(), D)) break;
    }
    std::memcpy(z_io, pz, sizeof(T) * D);
    std::memcpy(g_io, pg, sizeof(T) * D);
    *u_io = pu;
    stats[0] = T(accept_sum / double(n_steps > 0 ? n_steps : 1));
    stats[1] = T(depth);
    stats[2] = T(n_steps);
    stats[3] = T(diverging ? 1 : 0);
}

// ------------------------------------------------------------------------------------ MCLMC
template <typename T>
inline void unit(T* v, int64_t D) {
    T norm = std::sqrt(dot(v, v, D));
    if (norm < T(1e-13)) norm = T(1e-13);
    const T inv = T(1) / norm;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) v[i] *= inv;
}

// ESH velocity update by eps along -grad U (pyrobnn.infer.mcmc.mclmc_kernel.esh_velocity_update); returns dK
template <typename T>
T velocity_update(T* u, const T* grad, T eps, const T* sqrt_inv_mass, int64_t D, T* e) {
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) e[i] = -grad[i] * sqrt_inv_mass[i];
    const T gn = std::sqrt(dot(e, e, D));
    const T inv = T(1) / (gn < T(1e-13) ? T(1e-13) : gn);
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) e[i] *= inv;
    const T ue = dot(u, e, D);
    const T delta = eps * gn / T(D - 1);
    const T zeta = std::exp(-delta);
    const T a = (T(1) - zeta) * (T(1) + zeta + ue * (T(1) - zeta));
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) u[i] = e[i] * a + T(2) * zeta * u[i];
    unit(u, D);
    return (delta - T(LN2) + std::log(T(1) + ue + (T(1) - ue) * zeta * zeta)) * T(D - 1);
}

template <typename T>
void refresh(T* u, T eps, T L, const T* noise, int64_t D) {
    const T nu = std::sqrt(std::expm1(T(2) * eps / L) / T(D));
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) u[i] += nu * noise[i];
    unit(u, D);
}

// whether every entry of a, b and c is finite: x - x is 0 for a finite x and NaN otherwise (no
// -ffinite-math-only among the flags, so the compiler keeps it), one vectorized pass
template <typename T>
inline bool all_finite(const T* a, const T* b, const T* c, int64_t D) {
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < D; ++i) s += (a[i] - a[i]) + (b[i] - b[i]) + (c[i] - c[i]);
    return s == T(0);
}

// one MCLMC step of one chain (pyrobnn.infer.mcmc.mclmc_kernel.mclmc_step); n0, n1: its two noise rows
template <typename T>
void mclmc_chain(const Model& m, T* z, T* u, T* energy, T* grad, T step, T L, const T* sqrt_inv_mass,
                 const T* n0, const T* n1, T* d_energy, T* finite_out, Work<T>& w, T* buf) {
    // buf: 5 D entries of scratch, every one written before it is read
    const int64_t D = m.dim;
    const T b1 = T(MCLACHLAN_B1);
    T* u1 = buf; T* z2 = u1 + D; T* g2 = z2 + D; T* g3 = g2 + D; T* e = g3 + D;
    std::memcpy(u1, u, sizeof(T) * D);
    refresh(u1, T(0.5) * step, L, n0, D);
    T dk = velocity_update(u1, grad, b1 * step, sqrt_inv_mass, D, e);
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) z2[i] = z[i] + T(0.5) * step * sqrt_inv_mass[i] * u1[i];
    value_and_grad(m, z2, g2, w);
    dk += velocity_update(u1, g2, (T(1) - T(2) * b1) * step, sqrt_inv_mass, D, e);
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) z2[i] += T(0.5) * step * sqrt_inv_mass[i] * u1[i];
    T e3 = value_and_grad(m, z2, g3, w);
    dk += velocity_update(u1, g3, b1 * step, sqrt_inv_mass, D, e);
    refresh(u1, T(0.5) * step, L, n1, D);
    T de = dk + e3 - *energy;
    const bool finite = std::isfinite(de) && all_finite(z2, g3, u1, D);
    if (finite) {
        std::memcpy(z, z2, sizeof(T) * D);
        std::memcpy(u, u1, sizeof(T) * D);
        std::memcpy(grad, g3, sizeof(T) * D);
        *energy = e3;
        *d_energy = de;
    } else {  // stay, with a fresh random direction: the second refresh's noise, which the step's
              // finiteness does not depend on (it enters after the last gradient)
        std::memcpy(u, n1, sizeof(T) * D);
        unit(u, D);
        *d_energy = T(0);
    }
    *finite_out = finite ? T(1) : T(0);
}

template <typename T>
void batch_value_and_grad(const Model* m, int64_t chains, const T* z, T* u, T* g) {
    Work<T> w(*m);
    for (int64_t c = 0; c < chains; ++c) u[c] = value_and_grad(*m, z + c * m->dim, g + c * m->dim, w);
}

template <typename T>
void batch_nuts(const Model* m, int64_t chains, T* z, T* u, T* g, const T* r0, const T* inv_mass, const T* step,
                int64_t max_depth, const T* uniforms, T* stats) {
    Work<T> w(*m);
    const int64_t D = m->dim, row = 2 * max_depth + (int64_t(1) << max_depth) - 1;
    for (int64_t c = 0; c < chains; ++c)
        nuts_chain(*m, z + c * D, u + c, g + c * D, r0 + c * D, inv_mass + c * D, step[c], max_depth, uniforms + c * row,
                   stats + 4 * c, w);
}

template <typename T>
void batch_mclmc(const Model* m, int64_t chains, T* z, T* u, T* energy, T* grad, const T* step, const T* L,
                 const T* sqrt_inv_mass, const T* noise, int64_t noise_row, T* d_energy, T* finite) {
    // noise: the two rows of (2, all chains, D), noise_row entries apart, at this group's first chain
    Work<T> w(*m);
    const int64_t D = m->dim;
    std::unique_ptr<T[]> buf(new T[5 * D]);  // not zeroed: a step writes its scratch before reading it
    for (int64_t c = 0; c < chains; ++c)
        mclmc_chain(*m, z + c * D, u + c * D, energy + c, grad + c * D, step[c], L[c], sqrt_inv_mass + c * D,
                    noise + c * D, noise + noise_row + c * D, d_energy + c, finite + c, w, buf.get());
}

}  // namespace

// ------------------------------------------------------------------------------------ C ABI
extern "C" {

int64_t pyrobnn_kernels_abi() { return 2; }

void pyrobnn_value_and_grad_f32(const Model* m, int64_t chains, const float* z, float* u, float* g) {
    batch_value_and_grad(m, chains, z, u, g);
}
void pyrobnn_value_and_grad_f64(const Model* m, int64_t chains, const double* z, double* u, double* g) {
    batch_value_and_grad(m, chains, z, u, g);
}

void pyrobnn_nuts_f32(const Model* m, int64_t chains, float* z, float* u, float* g, const float* r0, const float* inv_mass,
                      const float* step, int64_t max_depth, const float* uniforms, float* stats) {
    batch_nuts(m, chains, z, u, g, r0, inv_mass, step, max_depth, uniforms, stats);
}
void pyrobnn_nuts_f64(const Model* m, int64_t chains, double* z, double* u, double* g, const double* r0,
                      const double* inv_mass, const double* step, int64_t max_depth, const double* uniforms, double* stats) {
    batch_nuts(m, chains, z, u, g, r0, inv_mass, step, max_depth, uniforms, stats);
}

void pyrobnn_mclmc_f32(const Model* m, int64_t chains, float* z, float* u, float* energy, float* grad, const float* step,
                       const float* L, const float* sqrt_inv_mass, const float* noise, int64_t noise_row, float* d_energy,
                       float* finite) {
    batch_mclmc(m, chains, z, u, energy, grad, step, L, sqrt_inv_mass, noise, noise_row, d_energy, finite);
}
void pyrobnn_mclmc_f64(const Model* m, int64_t chains, double* z, double* u, double* energy, double* grad,
                       const double* step, const double* L, const double* sqrt_inv_mass, const double* noise,
                       int64_t noise_row, double* d_energy, double* finite) {
    batch_mclmc(m, chains, z, u, energy, grad, step, L, sqrt_inv_mass, noise, noise_row, d_energy, finite);
}
}
