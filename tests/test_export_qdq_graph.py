"""The integer form of an exported QDQ graph (compressor.export.qdq_graph): requantizations on
one grid folded, concatenations on integers, batch norms between grids as int8 depthwise
convolutions; ONNX Runtime still computes what the simulation computes."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from compressor.export.qdq import qdq_form
from compressor.export.qdq_graph import REWRITES, integer_rewrites
from compressor.models.layers.eltwise import Concat
from compressor.quantization.core.settings import settings_from_args
from compressor.quantization.simulated.graph import explicit_graph
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from compressor.quantization.statistics.collect import collect_stats
from tests.test_quant_graph import trained_like_model

onnx = pytest.importorskip("onnx", reason="install the onnx extra: pip install -e '.[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="install the onnx extra: pip install -e '.[onnx]'")

pytestmark = pytest.mark.usefixtures("one_thread")


def _simulated(arch: str, side: int | None) -> tuple[torch.nn.Module, torch.Tensor]:
    """torch.ao's recipe (asym_u activations, per-channel symmetric weights) on a trained-like
    model, and inputs."""
    model, x = trained_like_model(arch, side)
    graph = explicit_graph(model, x[:1])
    settings = settings_from_args({"mode": {"activations": "asym_u", "weights": "sym"},
                                   "per_channel_wts": True}, "q")
    return PostTrainLinearQuantizer(settings, collect_stats(graph, [x])).quantize(graph), x


def _exported(simulated: torch.nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    """The QDQ form as torch.onnx writes it, before any rewrite."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(qdq_form(simulated), (x,), dynamo=True).model_proto


def _run(proto: onnx.ModelProto, x: torch.Tensor, optimized: bool = True) -> np.ndarray:
    """ONNX Runtime's outputs; not `optimized`: the graph's own semantics, node by node (ORT's
    optimizer merges a double QDQ pair on two grids into one, which changes values)."""
    onnx.checker.check_model(proto, full_check=True)
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def _ops(proto: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in proto.graph.node]


def _producers(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {name: node for node in proto.graph.node for name in node.output}


def _qparams(proto: onnx.ModelProto, node: onnx.NodeProto) -> tuple[bytes, ...]:
    """A Q / DQ node's scale and zero point, as bytes."""
    found = {init.name: onnx.numpy_helper.to_array(init) for init in proto.graph.initializer}
    found.update({n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
                  for n in proto.graph.node if n.op_type == "Constant"})
    return tuple(found[name].tobytes() for name in node.input[1:3])


def _two_branch_graph() -> onnx.ModelProto:
    """What torch.onnx writes for two quantized branches concatenated on their shared grid:
    each wrapper's output quantized, quantized again as the next wrapper's input, the
    concatenation dequantizing both and quantizing its result on the same grid."""
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    scale, zero_point = 0.05, 128
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s"),
             numpy_helper.from_array(np.array(zero_point, np.uint8), "z"),
             numpy_helper.from_array(np.array(0.1, np.float32), "s_out"),
             numpy_helper.from_array(np.array(3, np.uint8), "z_out")]

    def qdq(x: str, name: str, grid: tuple[str, str] = ("s", "z")) -> list[onnx.NodeProto]:
        return [helper.make_node("QuantizeLinear", [x, *grid], [f"{name}_q"]),
                helper.make_node("DequantizeLinear", [f"{name}_q", *grid], [name])]

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
             *qdq("a", "a1"), *qdq("a1", "a2"), *qdq("b", "b1"), *qdq("b1", "b2"),
             helper.make_node("Concat", ["a2", "b2"], ["cat"], axis=1), *qdq("cat", "c1"),
             *qdq("c1", "y", ("s_out", "z_out"))]  # a change of grid stays
    graph = helper.make_graph(
        nodes, "two_branches",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 6, 4, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_folding_requantizations_and_concatenating_integers_is_exact() -> None:
    """Afterwards the Concat reads the branches' integers, no QuantizeLinear reads a
    DequantizeLinear on its own grid (the change onto the output's grid stays), and ONNX
    Runtime's outputs are bit for bit the same."""
    before = _two_branch_graph()
    after = copy.deepcopy(before)
    counts = integer_rewrites(after)
    assert counts == {"requantize_folded": 2, "integer_concat": 1, "batch_norm_as_int8_conv": 0}
    assert set(counts) == set(REWRITES)
    producers = _producers(after)
    concat = next(node for node in after.graph.node if node.op_type == "Concat")
    assert [producers[name].op_type for name in concat.input] == ["QuantizeLinear"] * 2
    for node in after.graph.node:
        source = producers.get(node.input[0])
        if node.op_type == "QuantizeLinear" and source is not None \
                and source.op_type == "DequantizeLinear":
            assert _qparams(after, source) != _qparams(after, node)  # a change of grid
    assert _ops(after) == ["Relu", "Neg", "QuantizeLinear", "QuantizeLinear", "Concat",
                          "DequantizeLinear", "QuantizeLinear", "DequantizeLinear"]
    x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    assert np.array_equal(_run(after, x, optimized=False), _run(before, x, optimized=False))


def test_a_batch_norm_between_grids_becomes_an_int8_depthwise_conv() -> None:
    """DenseNet-BC: every concatenation on integers, and every pre-activation BN -> ReLU read
    from a grid and quantized afterwards a depthwise 1x1 conv of +-127 weights, whose logits
    stay within a few output steps of the float batch norm's."""
    simulated, x = _simulated("densenet_bc_40_cifar", None)
    before = _exported(simulated, x)
    after = copy.deepcopy(before)
    counts = integer_rewrites(after)
    cats = [m for m in simulated.modules() if isinstance(getattr(m, "wrapped", None), Concat)]
    assert counts["integer_concat"] == len(cats)
    # the 21 norm -> ReLU of 18 dense layers, 2 transitions and the head: all read a grid
    # (directly, or through a transition's 2x2 average pooling: a 2x2 stride-2 conv), and all
    # are quantized afterwards but the head's (its ReLU feeds the float global pooling)
    norms = [node for node in before.graph.node if node.op_type == "BatchNormalization"]
    assert len(norms) == 21 and counts["batch_norm_as_int8_conv"] == 20
    producers = _producers(after)
    left = [node for node in after.graph.node if node.op_type == "BatchNormalization"]
    assert len(left) == 1 and producers[left[0].input[0]].op_type == "DequantizeLinear"
    weights = {init.name: onnx.numpy_helper.to_array(init) for init in after.graph.initializer}
    depthwise = [node for node in after.graph.node if node.op_type == "Conv"
                 and next(a.i for a in node.attribute if a.name == "group") > 1]
    assert len(depthwise) == counts["batch_norm_as_int8_conv"]
    kernels = []
    for conv in depthwise:
        ints = weights[producers[conv.input[1]].input[0]]
        assert ints.dtype == np.int8 and set(np.unique(np.abs(ints))) <= {0, 127}
        assert weights[producers[conv.input[2]].input[0]].dtype == np.int32
        kernels.append(list(next(a.ints for a in conv.attribute if a.name == "kernel_shape")))
    assert kernels.count([2, 2]) == 2 and kernels.count([1, 1]) == 18
    with torch.no_grad():
        sim = simulated(x).numpy()
    step = 1 / float(simulated.classifier.output_scale)
    assert np.abs(_run(before, x) - sim).max() <= 3 * step
    assert np.abs(_run(after, x) - sim).max() <= 3 * step
