"""--memory-efficient auto --memory-budget GIB: the fastest candidate whose measured step fits."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from compressor.assembly.builder import build_model
from compressor.memory import (
    InPlaceABN,
    MeasuredVariant,
    choose_memory_variant,
    measure_candidates,
    memory_candidates,
    variant_label,
)
from compressor.memory.recipe import variants_of
from compressor.models import ModelDescription, create_model, description_of, get_arch_spec
from compressor.training.checkpoint import load_checkpoint
from compressor.utils.errors import CheckpointError, UsageError
from tests.conftest import assert_user_error, run_cli

MODEL = ("-a", "resnet20_cifar", "--dataset", "synthetic", "--input-size", "3,16,16")
RUN = ("-b", "16", "-j", "0", "--cpu", "--vs", "0", "--etrs", "0.05", "--etes", "0.05",
       "--lr", "0.05", "--deterministic", "-p", "0")
GIB = 2 ** 30
CHOICE = re.compile(r"memory-efficient auto: (\S+), peak ")
BOTH = ("recompute", "inplace-abn")


def _resnet20(size: int = 16) -> torch.nn.Module:
    spec = get_arch_spec("resnet20_cifar")
    return create_model("resnet20_cifar", "cifar10",
                        input_spec=spec.input_spec("cifar10").with_overrides((3, size, size)))


def _recipe(checkpoint: dict) -> object:
    return ModelDescription.from_checkpoint(checkpoint).recipe("memory_efficient")


def _choice(log: str) -> str:
    found = CHOICE.findall(log)
    assert len(found) == 1, log
    return found[0]


@pytest.fixture(scope="module")
def peaks(one_thread: None) -> dict[str, int]:
    """Each candidate's measured peak for the CLI runs' model and batch, by label."""
    model = _resnet20()
    measured = measure_candidates(model, get_arch_spec("resnet20_cifar"), 16)
    return {m.label: int(m.peak_bytes or 0) for m in measured}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, peaks: dict[str, int]) -> Iterator[Path]:
    """A from-scratch auto run whose budget plain misses (0.8 x its peak), resumed with the same
    flags, and the resumed checkpoint evaluated."""
    out = tmp_path_factory.mktemp("auto_runs")
    budget = f"{0.8 * peaks['plain'] / GIB:.6f}"
    auto = ("--memory-efficient", "auto", "--memory-budget", budget)
    fit = run_cli(*MODEL, *RUN, *auto, "--epochs", "1", "-o", str(out), "-n", "fit")
    assert fit.returncode == 0, fit.stderr[-3000:]
    chosen = _choice((out / "fit" / "log.txt").read_text())
    if "+" not in chosen:  # the same variant named: measuring must not change the seeded run
        named = run_cli(*MODEL, *RUN, "--memory-efficient", chosen, "--epochs", "1",
                        "-o", str(out), "-n", "named")
        assert named.returncode == 0, named.stderr[-3000:]
    resumed = run_cli("--resume-from", str(out / "fit" / "checkpoint.pth.tar"), *RUN, *auto,
                      "--epochs", "2", "-o", str(out), "-n", "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    evaluated = run_cli("--resume-from", str(out / "resumed" / "checkpoint.pth.tar"), "-e",
                        "-j", "0", "--cpu", "--etes", "0.05", "-o", str(out), "-n", "eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    yield out


def test_candidates_are_plain_each_variant_and_both_where_they_compose() -> None:
    resnet = _resnet20()
    spec = get_arch_spec("resnet20_cifar")
    assert memory_candidates(resnet, spec) == [(), ("recompute",), ("inplace-abn",), BOTH]
    assert memory_candidates(resnet, spec, allow_inplace_abn=False) == [(), ("recompute",)]
    vgg = create_model("vgg11_cifar", "cifar10")  # no batch norm: no in-place ABN
    assert memory_candidates(vgg, get_arch_spec("vgg11_cifar")) == [(), ("recompute",)]
    assert variant_label(()) == "plain" and variant_label(list(BOTH)) == "recompute+inplace-abn"


def test_measuring_leaves_the_model_and_the_rng_as_they_were(one_thread: None) -> None:
    torch.manual_seed(3)
    model = _resnet20().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    measured = measure_candidates(model, get_arch_spec("resnet20_cifar"), 8)
    assert torch.equal(torch.get_rng_state(), rng)
    assert not model.training and all(p.grad is None for p in model.parameters())
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name  # weights and batch-norm statistics
    peaks = {m.label: m.peak_bytes for m in measured}
    assert all(peak and peak > 0 for peak in peaks.values())
    # the variants save less; both together least
    assert peaks["recompute+inplace-abn"] < min(peaks["recompute"], peaks["inplace-abn"])
    assert peaks["inplace-abn"] < peaks["plain"] and peaks["recompute"] < peaks["plain"]


def _m(variants: tuple[str, ...], mib: float | None, ms: float) -> MeasuredVariant:
    return MeasuredVariant(variants, None if mib is None else int(mib * 2 ** 20), ms / 1000)


MEASURED = [_m((), 10, 100), _m(("recompute",), 5, 140), _m(("inplace-abn",), 7, 96),
            _m(BOTH, 4, 150)]


def test_the_fastest_that_fits_wins_and_a_near_tie_goes_to_the_simpler() -> None:
    def chosen(mib: float, measured: list[MeasuredVariant] = MEASURED) -> str:
        return choose_memory_variant(measured, int(mib * 2 ** 20), arch="a",
                                     batch_size=8).chosen.label

    assert chosen(1000) == "plain"  # in-place ABN's 4% is within one step's noise
    assert chosen(8) == "inplace-abn"
    assert chosen(6) == "recompute"
    assert chosen(4.5) == "recompute+inplace-abn"
    faster = [_m((), 10, 100), _m(("inplace-abn",), 7, 80)]
    assert chosen(1000, faster) == "inplace-abn"
    line = choose_memory_variant(MEASURED, 8 * 2 ** 20, arch="a", batch_size=8).describe()
    assert "inplace-abn, peak 7.0 MiB, budget 8.0 MiB" in line
    assert "plain 10.0 MiB 100 ms" in line and "recompute+inplace-abn 4.0 MiB 150 ms" in line


def test_nothing_fitting_names_the_smallest_peak_and_the_fix() -> None:
    with pytest.raises(UsageError) as error:
        choose_memory_variant(MEASURED, 3 * 2 ** 20, arch="resnet20_cifar", batch_size=8)
    text = str(error.value)
    assert "\n" not in text and "resnet20_cifar" in text and "-b 8" in text
    needed = float(re.search(r"--memory-budget to ([\d.e-]+)", text).group(1))
    assert needed * GIB >= 4 * 2 ** 20 and "recompute+inplace-abn's 4.0 MiB" in text
    assert "lower -b" in text
    with pytest.raises(UsageError, match="ran out of device memory"):
        choose_memory_variant([_m((), None, math.inf)], GIB, arch="a", batch_size=8)
    line = choose_memory_variant([_m((), None, math.inf), _m(("recompute",), 5, 140)], GIB,
                                 arch="a", batch_size=8).describe()
    assert "plain out of memory; recompute 5.0 MiB 140 ms" in line


def test_the_choice_fits_the_budget_and_is_recorded(runs: Path, peaks: dict[str, int]) -> None:
    budget = 0.8 * peaks["plain"]
    chosen = _choice((runs / "fit" / "log.txt").read_text())
    assert chosen != "plain" and peaks[chosen] <= budget
    checkpoint = load_checkpoint(runs / "fit" / "checkpoint.pth.tar")
    assert variant_label(_recipe(checkpoint)) == chosen
    args = yaml.safe_load((runs / "fit" / "args.yaml").read_text())
    assert args["memory_efficient"] == "auto"
    assert args["memory_budget"] == pytest.approx(budget / GIB, rel=1e-4)
    steps = args["model_attrs"]["transforms"]
    assert [variant_label(s["recipe"]) for s in steps if s["name"] == "memory_efficient"] == \
        [chosen]


def test_measuring_keeps_a_seeded_run_as_the_named_variant_trains_it(runs: Path) -> None:
    if not (runs / "named").exists():
        pytest.skip("auto chose a combination, which has no flag of its own")
    fit = load_checkpoint(runs / "fit" / "checkpoint.pth.tar")["state_dict"]
    named = load_checkpoint(runs / "named" / "checkpoint.pth.tar")["state_dict"]
    assert list(fit) == list(named)
    for name, tensor in fit.items():
        assert torch.equal(tensor, named[name]), name


def test_a_recorded_combination_rebuilds_both_variants_in_order() -> None:
    plain = _resnet20()
    description = description_of(plain).with_transform("memory_efficient", list(BOTH))
    model = build_model(description)
    assert model.grad_checkpointing
    assert isinstance(model.layer1[0].bn1, InPlaceABN)
    assert description_of(model).recipe("memory_efficient") == list(BOTH)
    model.load_state_dict(plain.state_dict())  # the plain model's names
    assert variants_of("recompute") == ("recompute",) and variants_of(None) == ()
    with pytest.raises(CheckpointError, match="neither a variant name"):
        variants_of({"recompute": True})


def test_resume_and_evaluation_rebuild_the_recorded_choice(runs: Path) -> None:
    chosen = _choice((runs / "fit" / "log.txt").read_text())
    log = (runs / "resumed" / "log.txt").read_text()
    assert f"memory-efficient auto: {chosen}, as " in log and "not measured again" in log
    resumed = load_checkpoint(runs / "resumed" / "checkpoint.pth.tar")
    assert resumed["epoch"] == 1 and variant_label(_recipe(resumed)) == chosen
    # -e rebuilds the variant from the checkpoint alone (in-place ABN's leaky ReLU included)
    trained = json.loads((runs / "resumed" / "results.json").read_text())
    evaluated = json.loads((runs / "eval" / "results.json").read_text())
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-5)


def test_a_generous_budget_picks_plain_and_given_weights_leave_inplace_abn_out(
        runs: Path, tmp_path: Path) -> None:
    # Weights from a file: in-place ABN (leaky ReLU) is left out, so plain races recompute
    # alone, which recomputes every block and is far slower than one step's noise.
    result = run_cli(*MODEL, *RUN, "--exp-load-weights-from",
                     str(runs / "fit" / "checkpoint.pth.tar"), "--memory-efficient", "auto",
                     "--memory-budget", "4", "--epochs", "1", "-o", str(tmp_path), "-n", "plain")
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "plain" / "log.txt").read_text()
    assert _choice(log) == "plain"
    assert "inplace-abn not considered" in log and "--exp-load-weights-from" in log
    assert "recompute " in log and "inplace-abn " not in log.split("measured:")[1].split(")")[0]
    assert _recipe(load_checkpoint(tmp_path / "plain" / "checkpoint.pth.tar")) is None


def test_nothing_fits_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    result = run_cli(*MODEL, *RUN, "--memory-efficient", "auto", "--memory-budget", "0.001",
                     "--epochs", "1", "-o", str(tmp_path), "-n", "none")
    assert_user_error(result, "--memory-budget 0.001 GiB", "smallest peak found",
                      "raise --memory-budget to", "lower -b")
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(("flags", "fragments"), [
    (("--memory-budget", "2"), ("--memory-budget is the budget of --memory-efficient auto",)),
    (("--memory-efficient", "auto"), ("add --memory-budget GIB",)),
    (("--memory-efficient", "auto", "--memory-budget", "0"), ("must be a number > 0",)),
    (("--memory-efficient", "auto", "--memory-budget", "-1"), ("must be a number > 0",)),
    (("--memory-efficient", "auto", "--memory-budget", "nan"), ("not a finite number",)),
    (("--memory-efficient", "recompute", "--memory-budget", "2"), ("--memory-budget",)),
    (("--memory-efficient", "auto", "--memory-budget", "2", "--summary", "compute"),
     ("--memory-efficient auto", "--summary trains none")),
])
def test_refusals_are_one_line(flags: tuple[str, ...], fragments: tuple[str, ...],
                               tmp_path: Path) -> None:
    result = run_cli(*MODEL, *RUN, *flags, "-o", str(tmp_path), "-n", "refused")
    assert_user_error(result, *fragments)
    assert not (tmp_path / "refused").exists()


def test_auto_is_refused_where_nothing_trains_or_a_budget_run_searches(runs: Path,
                                                                        tmp_path: Path) -> None:
    checkpoint = str(runs / "fit" / "checkpoint.pth.tar")
    auto = ("--memory-efficient", "auto", "--memory-budget", "2")
    for flags, fragment in ((("-e",), "-e trains none"),
                            (("--thinnify",), "--thinnify trains none"),
                            (("--target-macs", "0.5"), "a budget run changes it")):
        result = run_cli("--resume-from", checkpoint, *RUN, *auto, *flags,
                         "-o", str(tmp_path), "-n", "refused")
        assert_user_error(result, fragment)
        assert not (tmp_path / "refused").exists()
