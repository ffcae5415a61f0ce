"""Every registered architecture through post-training quantization to int8 kernels, as a user's
`--qe --qept` run takes it: traced, calibrated, simulated, converted, and the int8 model
computing what its simulation computes.

The whole registry takes minutes (ViT-H and RegNet-Y-128GF hold 630M weights), too long for the
five-minute suite: these tests are marked `registry`, which `bash scripts/test.sh` leaves out
(pyproject's addopts) and CI runs after the suite with `bash scripts/test.sh -m registry
tests/test_quant_registry.py`. The suite keeps one architecture per family and block kind
(tests/test_quant_graph.py) and a guard that every layer class of the registry is among those.
"""

from __future__ import annotations

import pytest
import torch

from compressor.models import get_arch_spec, list_archs
from compressor.quantization.core.settings import settings_from_args
from compressor.quantization.int8.convert import convert_to_int8
from compressor.quantization.simulated.graph import explicit_graph
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from compressor.quantization.statistics.collect import collect_stats
from tests.test_quant_graph import FAMILIES, trained_like_model

pytestmark = [pytest.mark.registry, pytest.mark.usefixtures("one_thread")]

SMALL_SIDE = 64  # torchvision's networks pool adaptively: a small input exercises every layer
# ViT-H's 14 px patches tile 56 px, not 64; the families' own sides (test_quant_graph: 96 for
# Inception v3, their own for MaxViT's windows and AlexNet-BN's classifier) for the others
SIDES = {**FAMILIES, "vit_h_14": 56}


def _side(arch: str) -> int | None:
    """The side the arch is quantized at (None: its own input spec's)."""
    if arch in SIDES:
        return SIDES[arch]
    spec = get_arch_spec(arch)
    own = spec.input_spec(spec.default_dataset).input_size[-1]
    return None if own <= SMALL_SIDE else SMALL_SIDE


@pytest.mark.parametrize("arch", list_archs())
def test_every_registered_architecture_converts_to_int8_as_simulated(arch: str) -> None:
    """The default `--qe` settings (what a user gets without flags) on a trained-like model:
    the int8 model's outputs lie closer to the simulation than twice the simulation's own
    distance from float."""
    if arch == "efficientnet_lite0":
        pytest.importorskip("efficientnet_lite_pytorch",
                            reason="install the lite extra: pip install -e '.[lite]'")
    model, x = trained_like_model(arch, _side(arch), batch=4)
    graph = explicit_graph(model, x[:1])
    stats = collect_stats(graph, [x[:2], x[2:]], histograms=False)
    simulated = PostTrainLinearQuantizer(settings_from_args({}, "q"), stats).quantize(graph)
    int8 = convert_to_int8(simulated)
    with torch.no_grad():
        floats, sim, got = model(x), simulated(x), int8(x)
    assert got.shape == sim.shape and torch.isfinite(got).all()
    own_error = float((sim - floats).abs().mean())
    assert float((got - sim).abs().mean()) <= 2 * own_error + 1e-6, int8.backend
