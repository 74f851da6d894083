"""torchext.profiling: which GPU kernels are torchext's, the totals from synthetic profiler events, the CPU path
(nothing to measure: share None and a reason, no crash), and on a GPU a real measurement."""

import glob
import json
import os
from types import SimpleNamespace

import pytest
import torch
from conftest import gpu
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

import torchext
from torchext.profiling import (
    FAMILY_LABELS,
    KERNEL_FAMILIES,
    DeviceEvent,
    GpuTimeProfiler,
    describe,
    device_events,
    event_family,
    gpu_time_share,
    is_torchext_kernel,
    kernel_family,
    op_family,
    short_kernel_name,
    summarize,
)

# Names as Kineto reports them (demangled), for kernels of cuda_ops/ and for stock ones.
RELU = (
    "void torchext::cuda_ops::(anonymous namespace)::unary_kernel<float, 4, torchext::cuda_ops::(anonymous "
    "namespace)::Relu>(float const*, float*, long, torchext::cuda_ops::(anonymous namespace)::Relu)"
)
RELU_MANGLED = "_ZN8torchext8cuda_ops12_GLOBAL__N_112unary_kernelIfLi4ENS1_4ReluEEEvPKT_PS4_lT1_"
WGMMA = (
    "void torchext::cuda_ops::(anonymous namespace)::matmul_wgmma_kernel<__nv_bfloat16, (torchext::cuda_ops::"
    "MatmulActivation)1, true>(CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, "
    "torchext::cuda_ops::(anonymous namespace)::WgmmaParams<__nv_bfloat16>)"
)
CE_FINALIZE = (
    "void torchext::cuda_ops::(anonymous namespace)::cross_entropy_finalize_kernel<float, float>(float const*)"
)
ATEN_ADD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
    "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
)
# A name shaped as torch 2.11 reports ATen's ReLU kernel: instantiated on lambdas, so it holds '#'s.
ATEN_CLAMP = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::launch_clamp_scalar("
    "at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()"
    "() const::{lambda()#8}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, "
    "at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
    "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#8}::operator()() const::"
    "{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)"
)
CUDNN = "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1"
CUTLASS = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop::Params)"
LOOKALIKE = "void mytorchext::scale_kernel<float>(float*, long)"


@pytest.mark.parametrize("name", [RELU, RELU_MANGLED, WGMMA, CE_FINALIZE])
def test_torchext_kernels_are_recognised(name):
    assert is_torchext_kernel(name), name


@pytest.mark.parametrize("name", [ATEN_ADD, CUDNN, CUTLASS, LOOKALIKE, "Memcpy HtoD (Pageable -> Device)", ""])
def test_stock_kernels_are_not_torchext(name):
    assert not is_torchext_kernel(name), name


def test_short_kernel_names():
    assert short_kernel_name(RELU) == "torchext::cuda_ops::unary_kernel<float, 4, torchext::cuda_ops::Relu>"
    assert short_kernel_name(RELU_MANGLED) == short_kernel_name(RELU), "a mangled name is demangled first"
    assert short_kernel_name(ATEN_ADD).startswith("at::native::vectorized_elementwise_kernel<4, ")
    assert short_kernel_name(CUTLASS) == "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
    assert short_kernel_name(CUDNN) == CUDNN


def _event(name, us, device_type=DeviceType.CUDA, activity="kernel", index=0, start=0.0):
    return SimpleNamespace(
        name=name,
        device_type=device_type,
        activity_type=activity,
        device_index=index,
        time_range=SimpleNamespace(start=start, end=start + us),
    )


def test_device_events_keep_only_gpu_activity():
    events = [
        _event("aten::relu", 50.0, device_type=DeviceType.CPU, activity="cpu_op"),
        _event("cudaLaunchKernel", 5.0, device_type=DeviceType.CPU, activity="cuda_runtime"),
        _event("ProfilerStep#1", 1000.0, activity="gpu_user_annotation"),  # spans kernels: counting it double-counts
        _event(RELU_MANGLED, 3.0),
        _event(ATEN_ADD, 7.0),
        _event("Memcpy HtoD (Pageable -> Device)", 11.0, activity="gpu_memcpy"),
        _event("Memset (Device)", 1.0, activity="gpu_memset"),
        _event(RELU, 2.0, index=1),
    ]
    got = device_events(events)
    assert got == [
        DeviceEvent(RELU, "kernel", 3.0),
        DeviceEvent(ATEN_ADD, "kernel", 7.0),
        DeviceEvent("Memcpy HtoD (Pageable -> Device)", "memcpy", 11.0),
        DeviceEvent("Memset (Device)", "memset", 1.0),
        DeviceEvent(RELU, "kernel", 2.0),
    ]
    assert [e.us for e in device_events(events, "cuda:1")] == [2.0], "[device index filter]"
    assert len(device_events(events, "cuda")) == 5, "no index: every device"


def test_device_events_without_activity_types():
    """An older profiler without activity types: memcpy/memset recognised by name, the rest are kernels."""
    events = [
        _event(RELU, 4.0, activity=None),
        _event("Memcpy DtoD (Device -> Device)", 2.0, activity=None),
        _event("Optimizer.step#Adam.step", 3449.8, activity=None),  # seen on torch 2.11: an annotation, not a kernel
        _event("ProfilerStep#12", 900.0, activity=None),
        _event(ATEN_CLAMP, 16.0, activity=None),  # a kernel, though its name holds '#'s
    ]
    got = device_events(events)
    assert [e.kind for e in got] == ["kernel", "memcpy", "kernel"]
    assert got[2] == DeviceEvent(ATEN_CLAMP, "kernel", 16.0), "stock ReLU kernels count in the total"
    assert not is_torchext_kernel(ATEN_CLAMP)


def test_device_events_skip_user_annotations():
    """A GPU-side annotation range flagged is_user_annotation is left out whatever its name and activity type."""
    span = FunctionEvent(
        id=3, name="train step", thread=0, start_us=0.0, end_us=900.0, device_type=DeviceType.CUDA,
        is_user_annotation=True,
    )  # fmt: skip
    assert device_events([span]) == []


def test_device_events_from_real_function_events():
    """The attributes read are those of torch's own FunctionEvent."""
    kernel = FunctionEvent(id=1, name=RELU, thread=0, start_us=10.0, end_us=14.5, device_type=DeviceType.CUDA)
    kernel.activity_type = "kernel"
    cpu = FunctionEvent(id=2, name="torchext::relu", thread=0, start_us=0.0, end_us=20.0)
    cpu.activity_type = "cpu_op"
    assert device_events([cpu, kernel]) == [DeviceEvent(RELU, "kernel", 4.5)]


def test_summarize_totals_share_and_top_list():
    events = [
        DeviceEvent(RELU, "kernel", 3.0),
        DeviceEvent(RELU, "kernel", 3.0),
        DeviceEvent(WGMMA, "kernel", 10.0),
        DeviceEvent(ATEN_ADD, "kernel", 8.0),
        DeviceEvent(CUDNN, "kernel", 12.0),
        DeviceEvent("Memcpy HtoD (Pageable -> Device)", "memcpy", 4.0),
    ]
    r = summarize(events, top=3)
    assert r["total_us"] == 40.0 and r["torchext_us"] == 16.0 and r["share"] == pytest.approx(0.4)
    assert r["by_kind"] == {"kernel": 36.0, "memcpy": 4.0}
    assert r["events"] == 6 and r["reason"] is None
    assert [(k["full_name"], k["calls"], k["us"], k["torchext"]) for k in r["by_kernel"]] == [
        (CUDNN, 1, 12.0, False),
        (WGMMA, 1, 10.0, True),
        (ATEN_ADD, 1, 8.0, False),
    ], "top 3 by time"
    assert r["by_kernel"][1]["share"] == pytest.approx(0.25)
    rows = summarize(events, top=10)["by_kernel"]
    relu, memcpy = rows[3], rows[4]
    assert (relu["name"], relu["calls"], relu["us"]) == (short_kernel_name(RELU), 2, 6.0), "calls aggregate by name"
    assert (memcpy["name"], memcpy["kind"], memcpy["torchext"]) == ("Memcpy HtoD (Pageable -> Device)", "memcpy", False)
    assert "40.0%" in describe(r)


def test_summarize_without_gpu_activity():
    r = summarize([])
    assert r["share"] is None and r["total_us"] == 0.0 and "no GPU activity" in r["reason"]
    assert describe(r).startswith("torchext share of GPU time: not measured (the profiler recorded no GPU activity")


def test_cpu_device_returns_share_none_without_calling_fn():
    calls = []
    r = gpu_time_share(lambda: calls.append(1), steps=3, device="cpu")
    assert calls == [], "nothing to measure on the CPU: fn must not run"
    assert r["share"] is None and r["steps"] == 0 and r["device"] == "cpu"
    assert "'cpu'" in r["reason"] and "CUDA" in r["reason"]
    with pytest.raises(ValueError, match="steps"):
        gpu_time_share(lambda: None, steps=0, device="cpu")


def test_cuda_requested_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    r = gpu_time_share(lambda: None, device="cuda")
    assert r["share"] is None and "CUDA is not available" in r["reason"]
    assert gpu_time_share(lambda: None)["device"] == "cpu", "the default device is CUDA only where it exists"


def test_context_manager_on_cpu_runs_the_body():
    model = torchext.nn.ReLU()
    with GpuTimeProfiler(device="cpu") as p:
        out = model(torch.tensor([-1.0, 2.0]))
    assert out.tolist() == [0.0, 2.0]
    assert p.result["share"] is None and p.result["by_kernel"] == [] and p.result["reason"]


def test_real_cpu_profile_has_no_device_events():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torchext.ops.relu(torch.randn(16))
    assert any(e.name == "torchext::relu" for e in prof.events()), "the op should be in the CPU trace"
    assert device_events(prof.events()) == []


@gpu
def test_gpu_time_share_on_cuda():
    x = torch.randn(1 << 20, device="cuda")
    w = torch.randn(256, 256, device="cuda")

    def step():
        y = torchext.ops.relu(x) + 1.0  # one torchext kernel, one stock one
        torchext.functional.linear(y.view(-1, 256), w, activation="relu")
        return y

    r = gpu_time_share(step, steps=3, warmup=1)
    assert r["reason"] is None, r["reason"]
    assert r["steps"] == 3 and 0.0 < r["share"] < 1.0, r
    assert r["torchext_us"] > 0 and r["total_us"] >= r["torchext_us"]
    names = [k["full_name"] for k in r["by_kernel"] if k["torchext"]]
    assert any("unary_kernel" in n for n in names), names
    assert all(is_torchext_kernel(n) for n in names)
    fam = r["by_family"]
    assert sum(v["us"] for v in fam.values()) == pytest.approx(r["total_us"]), fam
    assert fam["elementwise"]["torchext_us"] > 0 and fam["gemm"]["torchext_us"] > 0, "relu's and linear's kernels"
    assert fam["elementwise"]["us"] > fam["elementwise"]["torchext_us"], "the stock add is elementwise too"
    with GpuTimeProfiler() as p:
        step()
    assert p.result["share"] is not None and p.result["share"] > 0


@gpu
def test_stock_reductions_count_in_their_layers_family():
    """On a real CUDA profile the profiler links each kernel to its CPU op: stock's global average pool (a mean, run
    by ATen's generic reduce kernel) counts as pooling and the convolution's bias-gradient sum as convolution, so
    nothing of this step is left in 'other'."""
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).cuda()
    x = torch.randn(8, 16, 12, 12, device="cuda", requires_grad=True)

    def step():
        pooled = torch.nn.functional.adaptive_avg_pool2d(conv(x), 1)
        pooled.backward(torch.ones_like(pooled))

    r = gpu_time_share(step, steps=2, warmup=1, top=50)
    assert r["reason"] is None, r["reason"]
    reductions = [(k["family"], k["name"][:60]) for k in r["by_kernel"] if "reduce_kernel" in k["full_name"]]
    assert {f for f, _ in reductions} == {"conv", "pool"}, reductions
    assert r["by_family"]["other"]["us"] == 0.0, [(k["family"], k["name"][:80]) for k in r["by_kernel"]]


@gpu
def test_stock_lambda_kernels_are_counted():
    """torch.relu runs an ATen kernel instantiated on a lambda ('{lambda()#1}' in its name): it is GPU work, not an
    annotation range, so it is in the total (it once was dropped, understating stock's GPU time)."""
    x = torch.randn(1 << 22, device="cuda")
    r = gpu_time_share(lambda: torch.relu(x), steps=2, warmup=1, top=50)
    assert r["events"] >= 2 and r["total_us"] > 0, r
    assert any("#" in k["full_name"] for k in r["by_kernel"]), [k["full_name"] for k in r["by_kernel"]]


# ---------------------------------------------------------------------------------------------------------------
# Op families of kernel names

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results", "cifar10")


def committed_kernels() -> dict:
    """{(name, kind): us} of every kernel row in the committed comparison runs (both models' profiler tables):
    the names torch 2.11's profiler reported for ATen, cuDNN, cuBLAS, inductor's Triton kernels and torchext."""
    rows: dict = {}
    for path in glob.glob(os.path.join(RESULTS, "**", "results.json"), recursive=True):
        with open(path) as f:
            results = json.load(f)
        for key in ("stock_gpu_time", "gpu_time_share"):
            profile = results.get(key)
            for row in profile.get("by_kernel", []) if isinstance(profile, dict) else []:
                rows[(row["full_name"], row["kind"])] = rows.get((row["full_name"], row["kind"]), 0.0) + row["us"]
    return rows


# (part of a real kernel's short name, lowercased; its family): every committed kernel holding the part must be
# sorted into the family, and at least one must hold it.
REAL_NAMES = [
    ("batch_norm_collect_statistics_channels_last_kernel", "batch_norm"),
    ("batch_norm_backward_elemt", "batch_norm"),
    ("cudnn::bn_bw_1c11_kernel_new", "batch_norm"),
    ("cudnn::bn_fw_tr_1c11_kernel_nchw", "batch_norm"),
    ("unrolled_elementwise_kernel_for_multi_outputs<3, at::native::batch_norm_update_stats_and_invert", "batch_norm"),
    ("triton_poi_fused__native_batch_norm_legit_functional_add_relu", "batch_norm"),
    ("triton_red_fused_native_batch_norm_backward", "batch_norm"),
    ("sm90_xmma_fprop_implicit_gemm", "conv"),
    ("sm90_xmma_dgrad_implicit_gemm", "conv"),
    ("sm90_xmma_wgrad_indexed_implicit_gemm", "conv"),
    ("cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel", "conv"),
    ("cudnn::engines_precompiled::nchwtonhwckernel", "conv"),
    ("nhwcaddpaddingkernel", "conv"),
    ("wgrad_alg0_engine", "conv"),
    ("cutlass__5x_cudnn", "conv"),
    ("torchext::cuda_ops::conv2d_fprop_kernel", "conv"),
    ("torchext::cuda_ops::conv2d_wgrad_kernel", "conv"),
    ("torchext::cuda_ops::conv2d_wgrad_reduce_kernel", "conv"),
    ("triton_red_fused_convolution_backward", "conv"),
    ("max_pool_forward_nchw", "pool"),
    ("max_pool_backward_nchw", "pool"),
    ("triton_poi_fused_max_pool2d_with_indices", "pool"),
    ("launch_clamp_scalar", "elementwise"),
    ("threshold_kernel_impl", "elementwise"),
    ("cudafunctor_add<c10::bfloat16>", "elementwise"),
    ("masked_fill_kernel", "elementwise"),
    ("fused_dropout_kernel", "elementwise"),
    ("torchext::cuda_ops::unary_kernel", "elementwise"),
    ("torchext::cuda_ops::binary_kernel", "elementwise"),
    ("triton_poi_fused_add_relu_backward", "elementwise"),
    ("sgemm_largek_lds64", "gemm"),
    ("sm80_xmma_gemm_f32f32", "gemm"),
    ("cutlass::kernel2<cutlass_80_", "gemm"),
    ("cublaslt::splitkreduce_kernel", "gemm"),
    ("cublaslt::epilogue::impl::globalkernel", "gemm"),
    ("scal_kernel<float", "gemm"),
    ("torchext::cuda_ops::matmul_v", "gemm"),
    ("torchext::cuda_ops::split_k_reduce_kernel", "gemm"),
    ("torchext::cuda_ops::linear_backward_epilogue_kernel", "gemm"),
    ("nll_loss_forward_reduce_cuda_kernel_2d", "loss"),
    ("nll_loss_backward_reduce_cuda_kernel_2d", "loss"),
    ("softmax_warp_forward", "loss"),
    ("torchext::cuda_ops::cross_entropy_", "loss"),
    ("fusedsgdmathfunctor", "optimizer"),
    ("at::native::multi_tensor_apply_kernel", "optimizer"),
    ("direct_copy_kernel_cuda", "copy"),
    ("bfloat16_copy_kernel_cuda", "copy"),
    ("fillfunctor<int>", "copy"),
    ("triton_poi_fused__to_copy", "copy"),
    ("memset (device)", "copy"),
    ("memcpy dtoh", "copy"),
    ("at::native::reduce_kernel<", "other"),
]


@pytest.mark.parametrize("part,family", REAL_NAMES, ids=[p[:40] for p, _ in REAL_NAMES])
def test_kernel_family_of_real_kernel_names(part, family):
    names = [(n, k) for n, k in committed_kernels() if part in short_kernel_name(n).lower()]
    assert names, f"no committed kernel name holds {part!r}"
    for name, kind in names:
        assert kernel_family(name, kind) == family, f"[{name}] is {kernel_family(name, kind)}, not {family}"


NS = "void torchext::cuda_ops::(anonymous namespace)::"


@pytest.mark.parametrize(
    "name,family",
    [
        (RELU, "elementwise"),
        (RELU_MANGLED, "elementwise"),
        (WGMMA, "gemm"),
        (CE_FINALIZE, "loss"),
        (CUTLASS, "gemm"),
        # torchext's op families to come: their kernels are named after their op.
        (NS + "batch_norm_forward_kernel<__nv_bfloat16, float, 4>(__nv_bfloat16 const*, float*, long)", "batch_norm"),
        (NS + "batch_norm_backward_reduce_kernel<float>(float const*)", "batch_norm"),
        (NS + "max_pool2d_forward_kernel<float>(float const*, float*, long*)", "pool"),
        (NS + "max_pool2d_backward_kernel<c10::BFloat16>(long const*)", "pool"),
        (NS + "avg_pool2d_forward_kernel<float>(float const*, float*)", "pool"),
        (NS + "adaptive_avg_pool2d_backward_kernel<float>(float const*)", "pool"),
        (
            NS + "conv2d_dgrad_kernel<__nv_bfloat16, torchext::cuda_ops::(anonymous namespace)::ConvTile<128, 64> >()",
            "conv",
        ),
        (NS + "im2col_kernel<float>(float const*, float*)", "conv"),
        (NS + "softmax_rows_kernel<float>(float const*, float*)", "loss"),
        (NS + "transpose_copy_kernel<float>(float const*, float*)", "gemm"),
        (NS + "binary_kernel<__nv_bfloat16, 8, " + NS[5:] + "AddForward<float> >(__nv_bfloat16 const*)", "elementwise"),
        (NS + "sgd_kernel<float>(" + NS[5:] + "SgdBatch<float>, torchext::cuda_ops::SgdHyper)", "optimizer"),
    ],
)
def test_kernel_family_of_torchext_names(name, family):
    assert kernel_family(name) == family, name


def test_memcpy_and_memset_activities_are_copies():
    assert kernel_family("Memcpy HtoD (Pageable -> Device)", "memcpy") == "copy"
    assert kernel_family("Memset (Device)", "memset") == "copy"


def test_committed_kernels_are_nearly_all_classified():
    """Over every committed profiler table, 'other' holds under 1% of the GPU time, and no torchext kernel."""
    rows = committed_kernels()
    total = sum(rows.values())
    other = sum(us for (name, kind), us in rows.items() if kernel_family(name, kind) == "other")
    assert total > 0 and other / total < 0.01, f"{100 * other / total:.2f}% of the GPU time is 'other'"
    stray = [n for n, k in rows if is_torchext_kernel(n) and kernel_family(n, k) == "other"]
    assert not stray, stray
    assert set(KERNEL_FAMILIES) == set(FAMILY_LABELS)


# ATen's generic reduction, as Kineto names it: the same kernel sums a convolution's bias gradient and a pool's mean.
ATEN_SUM = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
    "unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
    "unsigned int, float, 4, 4>)"
)
ATEN_COPY = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>"


def _op(id, name, parent=None, start=0.0):
    """A CPU op as torch's FunctionEvent holds it (``id``, ``cpu_parent``)."""
    op = FunctionEvent(id=id, name=name, thread=0, start_us=start, end_us=start + 100.0, device_type=DeviceType.CPU)
    if parent is not None:
        op.set_cpu_parent(parent)
    return op


def _kernel(name, us, linked, start=0.0):
    kernel = FunctionEvent(
        id=1000 + linked, name=name, thread=0, start_us=start, end_us=start + us, device_type=DeviceType.CUDA,
        linked_correlation_id=linked,
    )  # fmt: skip
    kernel.activity_type = "kernel"
    return kernel


def test_generic_kernels_take_their_launching_ops_family():
    """A kernel whose name says nothing of its layer ('other' or 'elementwise' by name: ATen's reductions and
    functors) is counted in the family of the CPU op that launched it or of that op's callers, innermost first:
    stock's conv bias-gradient sum is convolution, a global average pool's mean is pooling, a sum under a GEMM's
    backward node GEMM, an elementwise kernel under the optimizer's step the optimizer. Copies stay copies, named
    kernels keep their name's family, torchext's kernels theirs, and a kernel with no linked op or no family in its op
    chain keeps its name's. A runtime call whose id (CUPTI's, counted apart) equals an op's does not take its place."""
    conv_bw = _op(10, "autograd::engine::evaluate_function: ConvolutionBackward0")
    conv_sum = _op(12, "aten::sum", _op(11, "aten::convolution_backward", conv_bw))
    pool_mean = _op(21, "aten::mean", _op(20, "aten::adaptive_avg_pool2d"))
    addmm_sum = _op(31, "aten::sum", _op(30, "AddmmBackward0"))
    relu = _op(40, "aten::relu")
    step = _op(51, "aten::mul_", _op(50, "Optimizer.step#SGD.step"))
    conv_copy = _op(61, "aten::copy_", _op(60, "aten::convolution"))
    lone_sum = _op(70, "aten::sum")
    torchext_under_conv = _op(81, "torchext::relu", _op(80, "aten::conv2d"))
    cpu = [conv_bw, conv_sum, conv_sum.cpu_parent, pool_mean, pool_mean.cpu_parent, addmm_sum, addmm_sum.cpu_parent]
    cpu += [relu, step, step.cpu_parent, conv_copy, conv_copy.cpu_parent, lone_sum]
    cpu += [torchext_under_conv, torchext_under_conv.cpu_parent]
    launch = FunctionEvent(
        id=12, name="cudaLaunchKernel", thread=0, start_us=0.0, end_us=1.0, device_type=DeviceType.CPU,
        linked_correlation_id=1030,
    )  # fmt: skip
    launch.set_cpu_parent(_op(90, "AddmmBackward0"))  # a runtime call of another op, its id the conv sum's
    cpu += [launch, launch.cpu_parent]
    kernels = [
        _kernel(ATEN_SUM, 7.0, 12), _kernel(ATEN_SUM, 5.0, 21), _kernel(ATEN_SUM, 3.0, 31),
        _kernel(ATEN_CLAMP, 2.0, 40), _kernel(ATEN_ADD, 1.0, 51), _kernel(ATEN_COPY, 4.0, 61),
        _kernel(ATEN_SUM, 6.0, 70), _kernel(ATEN_SUM, 9.0, 0), _kernel(RELU, 8.0, 81), _kernel(CUDNN, 10.0, 60),
    ]  # fmt: skip
    events = device_events(cpu + kernels)
    assert [e.op_family for e in events] == [
        "conv",
        "pool",
        "gemm",
        None,
        "optimizer",
        "conv",
        None,
        None,
        "conv",
        "conv",
    ]
    families = [event_family(e) for e in events]
    assert families == [
        "conv", "pool", "gemm", "elementwise", "optimizer", "copy", "other", "other", "elementwise", "conv",
    ], families  # fmt: skip
    fam = summarize(events, top=20)["by_family"]
    assert fam["conv"]["us"] == 17.0 and fam["pool"]["us"] == 5.0 and fam["gemm"]["us"] == 3.0
    assert fam["other"]["us"] == 15.0 and fam["elementwise"] == {"us": 10.0, "torchext_us": 8.0}
    rows = [
        (r["family"], r["calls"], r["us"]) for r in summarize(events, top=20)["by_kernel"] if r["full_name"] == ATEN_SUM
    ]
    assert sorted(rows) == [("conv", 1, 7.0), ("gemm", 1, 3.0), ("other", 2, 15.0), ("pool", 1, 5.0)], rows
    assert op_family(["aten::sum", "aten::mean", "MaxPool2DWithIndicesBackward0"]) == "pool"
    assert op_family(["aten::sum", "ProfilerStep#3"]) is None
    # the engine's sum of a residual's two incoming gradients, run in the producing node's range but not in the node
    assert op_family(["aten::add", "autograd::engine::evaluate_function: ConvolutionBackward0"]) is None
    assert op_family(["aten::upsample_bilinear2d"]) is None and op_family(["MmBackward0"]) == "gemm"
    assert op_family(["aten::max_pool2d_with_indices"]) == "pool" and op_family(["aten::mean"]) is None


def test_launching_ops_from_the_ops_kernel_lists():
    """torch 2.11's device events carry no link to their op (``linked_correlation_id`` unset): each CPU op lists the
    kernels it launched instead (name, device, duration), and a device event is matched to the first op that lists
    it and started before it ran; two ops listing the same kernel and duration are taken in turn, and an unlisted
    kernel has no op (nor does it take a later op's: it ran before that op started)."""
    conv_sum = _op(2, "aten::sum", _op(1, "aten::convolution_backward", start=10.0), start=10.0)
    pool_mean = _op(4, "aten::mean", _op(3, "aten::adaptive_avg_pool2d", start=20.0), start=20.0)
    lone_sum = _op(5, "aten::sum", start=30.0)
    conv_sum.append_kernel(ATEN_SUM, 0, 7.0)
    pool_mean.append_kernel(ATEN_SUM, 0, 5.0)
    lone_sum.append_kernel(ATEN_SUM, 0, 7.0)
    starts = {"unlisted": 1.0, "conv": 15.0, "pool": 25.0, "lone": 35.0, "short": 40.0}
    kernels = [_kernel(ATEN_SUM, 7.0, 0, starts["unlisted"])]
    kernels += [_kernel(ATEN_SUM, us, 0, starts[k]) for us, k in ((7.0, "conv"), (5.0, "pool"), (7.0, "lone"))]
    kernels += [_kernel(ATEN_SUM, 2.0, 0, starts["short"])]
    for k in kernels:
        del k.linked_correlation_id  # as torch 2.11's events: no attribute at all
    events = device_events([conv_sum, conv_sum.cpu_parent, pool_mean, pool_mean.cpu_parent, lone_sum, *kernels])
    assert [e.op_family for e in events] == [None, "conv", "pool", None, None]
    assert [event_family(e) for e in events] == ["other", "conv", "pool", "other", "other"]


def test_summarize_splits_time_by_family():
    events = [
        DeviceEvent(RELU, "kernel", 3.0),
        DeviceEvent(RELU, "kernel", 3.0),
        DeviceEvent(WGMMA, "kernel", 10.0),
        DeviceEvent(ATEN_ADD, "kernel", 8.0),
        DeviceEvent(CUDNN, "kernel", 12.0),
        DeviceEvent("Memcpy HtoD (Pageable -> Device)", "memcpy", 4.0),
    ]
    r = summarize(events, top=2)
    fam = r["by_family"]
    assert list(fam) == list(KERNEL_FAMILIES), "every family, in order, zeros included"
    assert fam["elementwise"] == {"us": 14.0, "torchext_us": 6.0}, "ReLU (torchext) and the add (ATen)"
    assert fam["gemm"] == {"us": 10.0, "torchext_us": 10.0}
    assert fam["conv"] == {"us": 12.0, "torchext_us": 0.0} and fam["copy"] == {"us": 4.0, "torchext_us": 0.0}
    assert sum(v["us"] for v in fam.values()) == r["total_us"], "over every event, not only the top 2"
    assert sum(v["torchext_us"] for v in fam.values()) == r["torchext_us"]
    assert [k["family"] for k in r["by_kernel"]] == ["conv", "gemm"]
