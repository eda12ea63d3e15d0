/* A Llama step's layers in one call: the same kernels, in the same order and with the same arguments,
   as engine/worker/models/llama.py's layers take one by one from Python (bound by
   engine/worker/native_layers.py, built by pageserve_kernels/torch_ops.py).

   Why: a step calls about a dozen kernels a layer, and from Python each call costs tens of microseconds
   of wrappers, checks, views and ctypes conversions, run between kernels that have just streamed a
   layer's weights through the caches (5.4-6.6 ms of a 64-row bfloat16 decode step on a Zen 4 host, 30
   layers). Here a call is a C function pointer or one dispatcher call, and the step's results are bit
   for bit the Python path's (the same kernels on the same bytes).

   The C kernels come as addresses (their ctypes bindings' functions): no second build of them, and
   whatever variant the host picked. The products run the implementation the Python path picked for
   this row count (engine/worker/layers/linear.py): our panel GEMM, oneDNN's packed product, or
   at::linear. Decode rows go to the C kernel (paged_decode.c); prompt chunks to the C prefill kernel
   (prefill_attention.c) or, where PyTorch's attention won on this host (pageserve_kernels/prefill_choice.py),
   to at::scaled_dot_product_attention as pageserve_kernels/cpu_attention.py calls it. A step with LoRA
   adapter rows adds each group's terms right after each product by the LoRA kernel (lora_f32.c /
   lora_bf16.c), the call engine/worker/lora/batch.py makes from the Python layers. Everything else
   (which steps qualify, the choices) is decided in Python. */
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
                             int64_t, int, int64_t, float);  // ..., window, softcap: 0, 0 (plain Llama layers)
using Gemm = void (*)(const void*, int64_t, const void*, const void*, void*, int64_t, int64_t, int64_t, int);
#define PREFILL_ARGS const void*, int64_t, const void*, const void*, void*, const int64_t*, const int64_t*, \
    const int64_t*, const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, int, int64_t, float
using PrefillF32 = void (*)(PREFILL_ARGS);
using PrefillBf16 = void (*)(PREFILL_ARGS, int);  // and whether to use AVX512-BF16 dot products
using Lora = void (*)(const void*, int64_t, void*, int64_t, int64_t, const int64_t*, const int64_t*, int64_t, int64_t,
                      int);

/* The order of `kernels` (engine/worker/native_layers.py's `_kernel_addresses`). */
struct Kernels {
    RmsNorm rms_norm;
    AddRmsNorm add_rms_norm;
    Rotary rotary;
    SiluAndMul silu_and_mul;
    StoreKv store_kv;
    PagedDecode decode;
    Gemm gemm;           // the model dtype's panel GEMM (gemm_f32 or gemm_bf16); null where it did not load
    Gemm gemm_amx;       // the bfloat16 one on AMX tiles over the same panels (gemm_bf16_amx); null: none here
    void* prefill;       // PrefillF32 or PrefillBf16 by the model's dtype; null: prompt chunks run PyTorch's SDPA
    Lora lora;           // the dtype's LoRA kernel (lora_f32 or lora_bf16); null: adapter steps run in Python
};

constexpr int64_t LORA_ENTRY = 25;  // int64s per (group, layer, projection): pageserve_kernels/cpu_lora.py's ENTRY
enum Projection { QKV, O, GATE_UP, DOWN, PROJECTIONS };

constexpr size_t PER_LAYER = 11;  // tensors a layer passes (see `layer`)

/* The order of `dims` (engine/worker/native_layers.py's `_make_layers`). */
struct Dims {
    int64_t n_q, n_kv, hd, isa;
    int64_t dot_products;  // the bfloat16 prefill kernel's flag; -1 for a float32 model
    int64_t impl[4];  // qkv, o, gate_up, down: 0 at::linear, 1 oneDNN packed, 2 panel GEMM, 3 its AMX twin
    int64_t out[4];   // their output widths
};

/* Kernel seconds and calls by kind, when the caller asks (`timings` (2, NUM_KINDS) float64, not empty:
   pageserve bench step-overhead); a clock read costs tens of nanoseconds. */
enum Kind { NORM, ROTARY, STORE_KV, ATTENTION, SILU, LINEAR, PREFILL, NUM_KINDS };

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

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
    static auto op = c10::Dispatcher::singleton()
        .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
        .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                          c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
    return op.call(x.contiguous(), packed, bias, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

/* x (T, K) -> (T, N) (+ bias where it is not empty: Qwen2's q/k/v), as engine/worker/layers/linear.py's
   `linear` for this implementation. */
at::Tensor linear(const Kernels& k, int64_t impl, const at::Tensor& x, const at::Tensor& w, int64_t n, int threads,
                  const at::Tensor& bias = at::Tensor()) {
    const bool biased = bias.defined() && bias.numel() > 0;
    const std::optional<at::Tensor> b = biased ? std::optional<at::Tensor>(bias) : std::nullopt;
    if (impl == 1) return onednn_linear(x, w, b);
    if (impl == 0) return at::linear(x, w, b);
    const Gemm gemm = impl == 3 ? k.gemm_amx : k.gemm;
    TORCH_CHECK(gemm != nullptr && x.scalar_type() == w.scalar_type() && x.stride(1) == 1, "panel GEMM unavailable");
    auto out = at::empty({x.size(0), n}, x.options());
    gemm(x.data_ptr(), x.stride(0), w.data_ptr(), biased ? bias.data_ptr() : nullptr, out.data_ptr(), x.size(0), n,
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
    double eps_double;  // the eps as the Python float PyTorch's norms get
    double sdpa_scale;  // the scale as the Python float PyTorch's attention gets there (`scale` is its float)
    const at::Tensor &cos, &sin, &slots;
    const at::Tensor &rows, &tables, &seq_lens;                  // decode rows (none: empty)
    const at::Tensor &starts, &lens, &context_lens, &chunk_tables;  // prompt chunks (none: empty)
    const at::Tensor &attn_out, &act;  // (T, n_q * hd), (T, I): every layer's, allocated once a step
    const at::Tensor &lora_rows, &lora_table;  // adapter groups' rows (n,), entries (G, layers, PROJECTIONS, ENTRY)
};

/* out += each adapter group's LoRA term of x for one projection of layer `li` (none without adapter rows):
   engine/worker/lora/batch.py's kernel call, on the same bytes. */
void add_lora(const Step& s, int64_t li, Projection p, const at::Tensor& x, at::Tensor& out) {
    if (s.lora_table.numel() == 0) return;
    TORCH_CHECK(x.stride(1) == 1 && out.stride(1) == 1 && x.size(0) == out.size(0), "llama_layers: LoRA rows");
    s.time(LINEAR, [&] {
        s.k.lora(x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0), x.size(1), s.lora_rows.data_ptr<int64_t>(),
                 s.lora_table.data_ptr<int64_t>() + (li * PROJECTIONS + p) * LORA_ENTRY, s.lora_table.size(0),
                 s.lora_table.stride(0), s.threads);
    });
}

/* Qwen3's per-head RMSNorm of q or k before rotary, written back into the QKV rows: what the Python layer
   calls (pageserve_kernels/fused_ops.py's rms_norm: the C kernel for float32 rows, fused_reference.py's
   formula for bfloat16 ones), so results equal its bit for bit. */
void norm_heads(const Step& s, at::Tensor& qkv, int64_t first, int64_t heads, const at::Tensor& weight) {
    const int64_t t = qkv.size(0), hd = s.d.hd;
    at::Tensor part = qkv.view({t, -1, hd}).narrow(1, first, heads);
    const at::Tensor x = part.reshape({t * heads, hd}).contiguous();
    at::Tensor normed;
    if (x.scalar_type() == at::kFloat) {
        normed = at::empty_like(x);
        s.k.rms_norm(x.data_ptr(), hd, weight.data_ptr(), normed.data_ptr(), t * heads, hd, s.eps, s.threads);
    } else {
        const at::Tensor x32 = x.to(at::kFloat);
        normed = (x32 * at::rsqrt(x32.pow(2).mean(-1, true) + s.eps_double) * weight.to(at::kFloat))
                     .to(weight.scalar_type());
    }
    part.copy_(normed.view({t, heads, hd}));
}

/* The prompt chunks' attention: pageserve_kernels/cpu_prefill.py's call. */
void prefill(const Step& s, const char* q, int64_t row, const at::Tensor& key_cache, const at::Tensor& value_cache) {
    const Dims& d = s.d;
    auto args = [&](auto fn, auto... extra) {
        fn(q, row, key_cache.data_ptr(), value_cache.data_ptr(), s.attn_out.data_ptr(), s.starts.data_ptr<int64_t>(),
           s.lens.data_ptr<int64_t>(), s.context_lens.data_ptr<int64_t>(), s.chunk_tables.data_ptr<int64_t>(),
           s.chunk_tables.size(1), s.starts.size(0), d.n_q, d.n_kv, d.hd, key_cache.size(1), s.scale, s.threads,
           int64_t{0}, 0.f, extra...);  // no window, no soft-cap: this loop serves plain Llama layers only
    };
    s.time(PREFILL, [&] {
        if (d.dot_products < 0) args(reinterpret_cast<PrefillF32>(s.k.prefill));
        else args(reinterpret_cast<PrefillBf16>(s.k.prefill), (int)d.dot_products);
    });
}

/* The prompt chunks' attention by PyTorch (the C prefill kernel lost to it here, or is not built): the
   calls, views and masks of pageserve_kernels/cpu_attention.py's chunk loop, so results equal its bit for
   bit. A fresh prompt attends to its own rows' K/V; a continuation gathers its blocks, masked causally
   from its context length on. */
void sdpa_prompts(const Step& s, const at::Tensor& qkv, const at::Tensor& key_cache, const at::Tensor& value_cache) {
    const Dims& d = s.d;
    const int64_t t = qkv.size(0), bs = key_cache.size(1);
    const at::Tensor heads = qkv.view({t, d.n_q + 2 * d.n_kv, d.hd});
    const at::Tensor q = heads.narrow(1, 0, d.n_q), k = heads.narrow(1, d.n_q, d.n_kv),
                     v = heads.narrow(1, d.n_q + d.n_kv, d.n_kv);
    const at::Tensor out = s.attn_out.view({t, d.n_q, d.hd});
    const int64_t *starts = s.starts.data_ptr<int64_t>(), *lens = s.lens.data_ptr<int64_t>(),
                  *context = s.context_lens.data_ptr<int64_t>();
    auto as_bhsd = [](const at::Tensor& x) { return x.transpose(0, 1).unsqueeze(0); };  // (L, h, hd) -> (1, h, L, hd)
    s.time(PREFILL, [&] {
        for (int64_t c = 0; c < s.starts.size(0); c++) {
            const int64_t len = lens[c], seq_len = context[c] + len;
            at::Tensor o;
            if (context[c] == 0) {
                o = at::scaled_dot_product_attention(as_bhsd(q.narrow(0, starts[c], len)),
                                                     as_bhsd(k.narrow(0, starts[c], len)),
                                                     as_bhsd(v.narrow(0, starts[c], len)), std::nullopt, 0.0, true,
                                                     s.sdpa_scale, true);
            } else {
                const at::Tensor blocks = s.chunk_tables[c].narrow(0, 0, (seq_len + bs - 1) / bs);
                auto gather = [&](const at::Tensor& cache) {
                    return as_bhsd(cache.index_select(0, blocks).view({-1, d.n_kv, d.hd}).narrow(0, 0, seq_len));
                };
                const at::Tensor mask = at::ones({len, seq_len}, qkv.options().dtype(at::kBool)).tril(context[c]);
                o = at::scaled_dot_product_attention(as_bhsd(q.narrow(0, starts[c], len)), gather(key_cache),
                                                     gather(value_cache), mask, 0.0, false, s.sdpa_scale, true);
            }
            out.narrow(0, starts[c], len).copy_(o[0].transpose(0, 1));
        }
    });
}

/* Attention of one layer: q and k rotated in place in the QKV product, K/V written, decode rows and prompt
   chunks attended (pageserve_kernels/cpu_attention.py's attend, native paths). */
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
    if (s.rows.numel()) s.time(ATTENTION, [&] {
        s.k.decode(base, key_cache.data_ptr(), value_cache.data_ptr(), s.attn_out.data_ptr(),
                   s.rows.data_ptr<int64_t>(), s.tables.data_ptr<int64_t>(), s.tables.size(1),
                   s.seq_lens.data_ptr<int64_t>(), s.rows.size(0), d.n_q, d.n_kv, d.hd, key_cache.size(1), s.scale,
                   s.max_seq, s.threads, row, (int)d.isa, int64_t{0}, 0.f);  // no window, no soft-cap
    });
    if (s.starts.numel() && s.k.prefill != nullptr) prefill(s, base, row, key_cache, value_cache);
    else if (s.starts.numel()) sdpa_prompts(s, qkv, key_cache, value_cache);
    return s.attn_out;
}

/* One decoder layer; `w` its eleven tensors: input norm, QKV, O, post-attention norm, gate-up, down,
   K cache, V cache, QKV bias, q norm, k norm (the last three empty where the model has none).
   h in the model dtype and residual float32 are overwritten, as in Python. `li`: the layer's index. */
void layer(const Step& s, at::TensorList w, at::Tensor& h, at::Tensor& residual, int64_t li) {
    const bool first = li == 0;
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
    auto qkv = s.time(LINEAR, [&] { return linear(s.k, d.impl[0], h, w[1], d.out[0], s.threads, w[8]); });
    add_lora(s, li, QKV, h, qkv);
    if (w[9].numel()) s.time(NORM, [&] {
        norm_heads(s, qkv, 0, d.n_q, w[9]);
        norm_heads(s, qkv, d.n_q, d.n_kv, w[10]);
    });
    at::Tensor key_cache = w[6], value_cache = w[7];
    const at::Tensor& o = attend(s, qkv, key_cache, value_cache);
    h = s.time(LINEAR, [&] { return linear(s.k, d.impl[1], o, w[2], d.out[1], s.threads); });
    add_lora(s, li, O, o, h);
    s.time(NORM, [&] {
        s.k.add_rms_norm(h.data_ptr(), residual.data_ptr<float>(), w[3].data_ptr(), t, hidden, s.eps, s.threads);
    });
    auto gate_up = s.time(LINEAR, [&] { return linear(s.k, d.impl[2], h, w[4], d.out[2], s.threads); });
    add_lora(s, li, GATE_UP, h, gate_up);
    s.time(SILU, [&] {
        s.k.silu_and_mul(gate_up.data_ptr(), gate_up.stride(0), s.act.data_ptr(), t, s.act.size(1), s.threads);
    });
    at::Tensor down = s.time(LINEAR, [&] { return linear(s.k, d.impl[3], s.act, w[5], d.out[3], s.threads); });
    add_lora(s, li, DOWN, s.act, down);
    h = down;
}

void check_lora(const Step& s, int64_t num_layers) {
    const at::Tensor &rows = s.lora_rows, &table = s.lora_table;
    if (table.numel() == 0) return;
    TORCH_CHECK(s.k.lora != nullptr, "llama_layers: adapter rows, but no LoRA kernel");
    TORCH_CHECK(rows.scalar_type() == at::kLong && rows.is_contiguous() && table.scalar_type() == at::kLong &&
                    table.is_contiguous() && table.dim() == 4 && table.size(1) == num_layers &&
                    table.size(2) == PROJECTIONS && table.size(3) == LORA_ENTRY,
                "llama_layers: LoRA rows (n,) and entries (G, layers, ", int64_t{PROJECTIONS}, ", ", LORA_ENTRY,
                ") int64");
}

void check_step(const Step& s, const at::Tensor& h, const at::Tensor& timings) {
    const int64_t t = h.size(0);
    TORCH_CHECK(h.dim() == 2 && h.is_contiguous(), "llama_layers: h must be (T, H) contiguous");
    for (const auto* x : {&s.rows, &s.tables, &s.seq_lens, &s.slots, &s.starts, &s.lens, &s.context_lens,
                          &s.chunk_tables})
        TORCH_CHECK(x->scalar_type() == at::kLong && x->is_contiguous(), "llama_layers: int64 metadata");
    TORCH_CHECK(s.slots.size(0) == t && s.seq_lens.size(0) == s.rows.size(0) && s.tables.size(0) == s.rows.size(0) &&
                    s.lens.size(0) == s.starts.size(0) && s.context_lens.size(0) == s.starts.size(0) &&
                    s.chunk_tables.size(0) == s.starts.size(0),
                "llama_layers: metadata lengths");
    int64_t covered = s.rows.size(0);
    for (int64_t c = 0; c < s.lens.size(0); c++) covered += s.lens.data_ptr<int64_t>()[c];
    TORCH_CHECK(covered == t, "llama_layers: decode rows and prompt chunks must cover every row");
    TORCH_CHECK(s.cos.scalar_type() == at::kFloat && s.cos.size(0) == t && s.cos.stride(-1) == 1,
                "llama_layers: rotary");
    TORCH_CHECK(timings.numel() == 0 || (timings.numel() == 2 * NUM_KINDS && timings.scalar_type() == at::kDouble &&
                                         timings.is_contiguous()),
                "llama_layers: timings");
}

/* A model's layers for one choice of products (engine/worker/native_layers.py makes one per row bucket's
   choice): built once, so a step passes only its own tensors. */
struct LlamaLayers : torch::CustomClassHolder {
    std::vector<at::Tensor> layers;  // per layer: input norm, QKV, O, post norm, gate-up, down, K cache, V cache,
                                     // QKV bias, q norm, k norm (empty: none)
    Kernels k;
    Dims d;
    double eps, scale;

    LlamaLayers(std::vector<at::Tensor> layers_, std::vector<int64_t> kernels, std::vector<int64_t> dims,
                double eps_, double scale_)
        : layers(std::move(layers_)), eps(eps_), scale(scale_) {
        TORCH_CHECK(kernels.size() == 10 && dims.size() == 13 && !layers.empty() && layers.size() % PER_LAYER == 0,
                    "LlamaLayers: bad kernel, dimension or layer lists");
        k = Kernels{reinterpret_cast<RmsNorm>(kernels[0]), reinterpret_cast<AddRmsNorm>(kernels[1]),
                    reinterpret_cast<Rotary>(kernels[2]), reinterpret_cast<SiluAndMul>(kernels[3]),
                    reinterpret_cast<StoreKv>(kernels[4]), reinterpret_cast<PagedDecode>(kernels[5]),
                    reinterpret_cast<Gemm>(kernels[6]), reinterpret_cast<Gemm>(kernels[7]),
                    reinterpret_cast<void*>(kernels[8]), reinterpret_cast<Lora>(kernels[9])};
        d = Dims{dims[0], dims[1], dims[2], dims[3], dims[4], {dims[5], dims[6], dims[7], dims[8]},
                 {dims[9], dims[10], dims[11], dims[12]}};
        for (size_t i = 6; i < layers.size(); i += PER_LAYER)
            TORCH_CHECK(layers[i].is_contiguous() && layers[i + 1].is_contiguous() && layers[i].dim() == 4 &&
                            layers[i].size(3) == d.hd && layers[i].sizes() == layers[i + 1].sizes(),
                        "LlamaLayers: KV caches");
    }

    /* The whole body after the embedding: hidden (T, H) float32 = residual + h after the last layer. Decode
       rows (rows, tables, seq_lens, max_seq) and prompt chunks (starts, lens, context_lens, chunk_tables) as
       pageserve_kernels/cpu_attention_plan.py plans them for the C kernels; either may be empty. LoRA adapter
       groups as engine/worker/lora/batch.py builds them (lora_rows, lora_table); both empty without. */
    at::Tensor run(at::Tensor h, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                   const at::Tensor& rows, const at::Tensor& tables, const at::Tensor& seq_lens, int64_t max_seq,
                   const at::Tensor& starts, const at::Tensor& lens, const at::Tensor& context_lens,
                   const at::Tensor& chunk_tables, const at::Tensor& lora_rows, const at::Tensor& lora_table,
                   const at::Tensor& timings) {
        TORCH_CHECK(layers[6].scalar_type() == h.scalar_type(), "llama_layers: h and the KV cache differ in dtype");
        double* seconds = timings.numel() ? timings.data_ptr<double>() : nullptr;
        const int64_t t = h.size(0);
        at::Tensor attn_out = at::empty({t, d.n_q * d.hd}, h.options()), act = at::empty({t, d.out[2] / 2}, h.options());
        Step s{k, d, Timer{seconds}, at::get_num_threads(), max_seq, (float)eps, (float)scale, eps, scale, cos, sin, slots,
               rows, tables, seq_lens, starts, lens, context_lens, chunk_tables, attn_out, act, lora_rows,
               lora_table};
        check_step(s, h, timings);
        check_lora(s, layers.size() / PER_LAYER);
        at::Tensor residual;
        at::TensorList all(layers);
        for (size_t i = 0; i < layers.size(); i += PER_LAYER)
            layer(s, all.slice(i, PER_LAYER), h, residual, (int64_t)(i / PER_LAYER));
        return residual + h;
    }
};

}  // namespace

TORCH_LIBRARY(pageserve, m) {
    m.class_<LlamaLayers>("LlamaLayers")
        .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<int64_t>, double, double>())
        .def("run", &LlamaLayers::run);
}
