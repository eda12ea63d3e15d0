/* A Llama decode step's layers in one call: the same kernels, in the same order and with the same
   arguments, as engine/worker/models/llama.py's layers take one by one from Python (bound by
   engine/worker/decode_program.py, built by pageserve_kernels/torch_ops.py).

   Why: a decode step calls about a dozen kernels a layer, and from Python each call costs tens of
   microseconds of wrappers, checks, views and ctypes conversions, run between kernels that have just
   streamed a layer's weights through the caches (5.7 ms of an 85 ms 64-row bfloat16 step on a Zen 4
   host, 30 layers). Here a call is a C function pointer or one dispatcher call, and the step's
   results are bit for bit the Python path's (the same kernels on the same bytes).

   The C kernels come as addresses (their ctypes bindings' functions): no second build of them, and
   whatever variant the host picked. The products run the implementation the Python path picked for
   this row count (engine/worker/layers/linear.py): our panel GEMM, oneDNN's packed product, or
   at::linear. Everything else (which steps qualify, the choices) is decided in Python. */
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <chrono>

namespace {

using RmsNorm = void (*)(const void*, int64_t, const void*, void*, int64_t, int64_t, float, int);
using AddRmsNorm = void (*)(void*, float*, const void*, int64_t, int64_t, float, int);
using SiluAndMul = void (*)(const void*, int64_t, void*, int64_t, int64_t, int);
using Rotary = void (*)(void*, int64_t, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int);
using StoreKv = int64_t (*)(const char*, int64_t, const char*, int64_t, char*, char*, const int64_t*, int64_t,
                            int64_t, int64_t);
using PagedDecode = void (*)(const void*, const void*, const void*, void*, const int64_t*, const int64_t*, int64_t,
                             const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, float, int64_t, int,
                             int64_t, int);
using GemmF32 = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t, int64_t, int);

/* The order of `kernels` (engine/worker/decode_program.py's `_kernel_addresses`). */
struct Kernels {
    RmsNorm rms_norm;
    AddRmsNorm add_rms_norm;
    Rotary rotary;
    SiluAndMul silu_and_mul;
    StoreKv store_kv;
    PagedDecode decode;
    GemmF32 gemm;  // null where the panel GEMM did not load
};

/* The order of `dims` (engine/worker/decode_program.py's `_make_layers`). */
struct Dims {
    int64_t n_q, n_kv, hd, isa;
    int64_t impl[4];  // qkv, o, gate_up, down: 0 at::linear, 1 oneDNN packed, 2 panel GEMM
    int64_t out[4];   // their output widths
};

/* Kernel seconds and calls by kind, when the caller asks (`timings` (2, NUM_KINDS) float64, not empty:
   pageserve bench step-overhead); a clock read costs tens of nanoseconds. */
enum Kind { NORM, ROTARY, STORE_KV, ATTENTION, SILU, LINEAR, NUM_KINDS };

struct Timer {
    double* seconds;  // seconds[kind], then calls[kind]; or null
    template <class F>
    auto operator()(Kind kind, F&& f) const {
        if (seconds == nullptr) return f();
        auto began = std::chrono::steady_clock::now();
        struct Add {
            double* to;
            std::chrono::steady_clock::time_point began;
            ~Add() {
                to[0] += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
                to[NUM_KINDS] += 1;
            }
        } add{seconds + kind, began};
        return f();
    }
};

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed) {
    static auto op = c10::Dispatcher::singleton()
        .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
        .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                          c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
    return op.call(x.contiguous(), packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(),
                   std::nullopt);
}

/* x (T, K) -> (T, N), as engine/worker/layers/linear.py's `linear` for this implementation. */
at::Tensor linear(const Kernels& k, int64_t impl, const at::Tensor& x, const at::Tensor& w, int64_t n, int threads) {
    if (impl == 1) return onednn_linear(x, w);
    if (impl == 0) return at::linear(x, w);
    TORCH_CHECK(k.gemm != nullptr && x.scalar_type() == at::kFloat && x.stride(1) == 1, "panel GEMM unavailable");
    auto out = at::empty({x.size(0), n}, x.options());
    k.gemm(x.data_ptr<float>(), x.stride(0), w.data_ptr<float>(), nullptr, out.data_ptr<float>(), x.size(0), n,
           x.size(1), threads);
    return out;
}

struct Step {
    const Kernels& k;
    const Dims& d;
    Timer time;
    int threads;
    int64_t max_seq;
    float eps, scale;
    const at::Tensor &cos, &sin, &rows, &tables, &seq_lens, &slots;
    const at::Tensor &attn_out, &act;  // (T, n_q * hd), (T, I): every layer's, allocated once a step
};

/* Attention of one layer: q and k rotated in place in the QKV product, K/V written, decode attention. */
const at::Tensor& attend(const Step& s, at::Tensor& qkv, at::Tensor& key_cache, at::Tensor& value_cache) {
    const Dims& d = s.d;
    const int64_t t = qkv.size(0), item = qkv.element_size(), row = qkv.stride(0);
    char* base = static_cast<char*>(qkv.data_ptr());
    s.time(ROTARY, [&] {
        s.k.rotary(base, row, s.cos.data_ptr<float>(), s.sin.data_ptr<float>(), s.cos.stride(0), t, d.n_q + d.n_kv,
                   d.hd, s.threads);
    });
    const int64_t width = d.n_kv * d.hd * item, num_slots = key_cache.size(0) * key_cache.size(1);
    int64_t bad = s.time(STORE_KV, [&] {
        return s.k.store_kv(base + d.n_q * d.hd * item, row * item, base + (d.n_q + d.n_kv) * d.hd * item,
                            row * item, static_cast<char*>(key_cache.data_ptr()),
                            static_cast<char*>(value_cache.data_ptr()), s.slots.data_ptr<int64_t>(), t, width,
                            num_slots);
    });
    TORCH_CHECK_INDEX(bad == 0, bad, " KV cache slots outside [0, ", num_slots, ")");
    s.time(ATTENTION, [&] {
        s.k.decode(base, key_cache.data_ptr(), value_cache.data_ptr(), s.attn_out.data_ptr(),
                   s.rows.data_ptr<int64_t>(),
                   s.tables.data_ptr<int64_t>(), s.tables.size(1), s.seq_lens.data_ptr<int64_t>(), s.rows.size(0),
                   d.n_q, d.n_kv, d.hd, key_cache.size(1), s.scale, s.max_seq, s.threads, row, (int)d.isa);
    });
    return s.attn_out;
}

/* One decoder layer; `w` its eight tensors: input norm, QKV, O, post-attention norm, gate-up, down,
   K cache, V cache. h in the model dtype and residual float32 are overwritten, as in Python. */
void layer(const Step& s, at::TensorList w, at::Tensor& h, at::Tensor& residual, bool first) {
    const Dims& d = s.d;
    const int64_t t = h.size(0), hidden = h.size(1);
    if (first) {  // engine/worker/models/llama.py: residual = h.float(); h = norm(residual)
        residual = h.to(at::kFloat);
        auto normed = at::empty({t, hidden}, w[0].options());
        s.time(NORM, [&] {
            s.k.rms_norm(residual.data_ptr(), residual.stride(0), w[0].data_ptr(), normed.data_ptr(), t, hidden,
                         s.eps, s.threads);
        });
        h = normed;
    } else {
        s.time(NORM, [&] {
            s.k.add_rms_norm(h.data_ptr(), residual.data_ptr<float>(), w[0].data_ptr(), t, hidden, s.eps, s.threads);
        });
    }
    auto qkv = s.time(LINEAR, [&] { return linear(s.k, d.impl[0], h, w[1], d.out[0], s.threads); });
    at::Tensor key_cache = w[6], value_cache = w[7];
    const at::Tensor& o = attend(s, qkv, key_cache, value_cache);
    h = s.time(LINEAR, [&] { return linear(s.k, d.impl[1], o, w[2], d.out[1], s.threads); });
    s.time(NORM, [&] {
        s.k.add_rms_norm(h.data_ptr(), residual.data_ptr<float>(), w[3].data_ptr(), t, hidden, s.eps, s.threads);
    });
    auto gate_up = s.time(LINEAR, [&] { return linear(s.k, d.impl[2], h, w[4], d.out[2], s.threads); });
    s.time(SILU, [&] {
        s.k.silu_and_mul(gate_up.data_ptr(), gate_up.stride(0), s.act.data_ptr(), t, s.act.size(1), s.threads);
    });
    h = s.time(LINEAR, [&] { return linear(s.k, d.impl[3], s.act, w[5], d.out[3], s.threads); });
}

void check_step(const at::Tensor& h, const at::Tensor& rows, const at::Tensor& tables, const at::Tensor& seq_lens,
                const at::Tensor& slots, const at::Tensor& cos, const at::Tensor& timings) {
    const int64_t t = h.size(0);
    TORCH_CHECK(h.dim() == 2 && h.is_contiguous(), "decode_layers: h must be (T, H) contiguous");
    TORCH_CHECK(rows.size(0) == t && slots.size(0) == t && seq_lens.size(0) == t && tables.size(0) == t,
                "decode_layers: every row must be a decode row");
    for (const auto* x : {&rows, &tables, &seq_lens, &slots})
        TORCH_CHECK(x->scalar_type() == at::kLong && x->is_contiguous(), "decode_layers: int64 metadata");
    TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.size(0) == t && cos.stride(-1) == 1, "decode_layers: rotary");
    TORCH_CHECK(timings.numel() == 0 || (timings.numel() == 2 * NUM_KINDS && timings.scalar_type() == at::kDouble &&
                                         timings.is_contiguous()),
                "decode_layers: timings");
}

/* A model's layers for one choice of products (engine/worker/decode_program.py makes one per row bucket's
   choice): built once, so a step passes only its own tensors. */
struct DecodeLayers : torch::CustomClassHolder {
    std::vector<at::Tensor> layers;  // per layer: input norm, QKV, O, post norm, gate-up, down, K cache, V cache
    Kernels k;
    Dims d;
    double eps, scale;

    DecodeLayers(std::vector<at::Tensor> layers_, std::vector<int64_t> kernels, std::vector<int64_t> dims,
                 double eps_, double scale_)
        : layers(std::move(layers_)), eps(eps_), scale(scale_) {
        TORCH_CHECK(kernels.size() == 7 && dims.size() == 12 && !layers.empty() && layers.size() % 8 == 0,
                    "DecodeLayers: bad kernel, dimension or layer lists");
        k = Kernels{reinterpret_cast<RmsNorm>(kernels[0]), reinterpret_cast<AddRmsNorm>(kernels[1]),
                    reinterpret_cast<Rotary>(kernels[2]), reinterpret_cast<SiluAndMul>(kernels[3]),
                    reinterpret_cast<StoreKv>(kernels[4]), reinterpret_cast<PagedDecode>(kernels[5]),
                    reinterpret_cast<GemmF32>(kernels[6])};
        d = Dims{dims[0], dims[1], dims[2], dims[3], {dims[4], dims[5], dims[6], dims[7]},
                 {dims[8], dims[9], dims[10], dims[11]}};
        for (size_t i = 6; i < layers.size(); i += 8)
            TORCH_CHECK(layers[i].is_contiguous() && layers[i + 1].is_contiguous() && layers[i].dim() == 4 &&
                            layers[i].size(3) == d.hd && layers[i].sizes() == layers[i + 1].sizes(),
                        "DecodeLayers: KV caches");
    }

    /* The whole body after the embedding: hidden (T, H) float32 = residual + h after the last layer. */
    at::Tensor run(at::Tensor h, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& rows,
                   const at::Tensor& tables, const at::Tensor& seq_lens, const at::Tensor& slots, int64_t max_seq,
                   const at::Tensor& timings) {
        check_step(h, rows, tables, seq_lens, slots, cos, timings);
        TORCH_CHECK(layers[6].scalar_type() == h.scalar_type(), "decode_layers: h and the KV cache differ in dtype");
        double* seconds = timings.numel() ? timings.data_ptr<double>() : nullptr;
        const int64_t t = h.size(0);
        at::Tensor attn_out = at::empty({t, d.n_q * d.hd}, h.options()), act = at::empty({t, d.out[2] / 2}, h.options());
        Step s{k, d, Timer{seconds}, at::get_num_threads(), max_seq, (float)eps, (float)scale, cos, sin, rows,
               tables, seq_lens, slots, attn_out, act};
        at::Tensor residual;
        at::TensorList all(layers);
        for (size_t i = 0; i < layers.size(); i += 8) layer(s, all.slice(i, 8), h, residual, i == 0);
        return residual + h;
    }
};

}  // namespace

TORCH_LIBRARY(pageserve, m) {
    m.class_<DecodeLayers>("DecodeLayers")
        .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<int64_t>, double, double>())
        .def("run", &DecodeLayers::run);
}
