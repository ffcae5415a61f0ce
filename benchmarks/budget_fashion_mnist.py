"""Budget runs on real Fashion-MNIST: uniform L1 filters vs Torch-Pruning global vs ours.

One dense resnet20_cifar per seed (a `compress_classifier.py` run) is shared by every arm of
that seed; each arm compresses it to each budget (MACs 0.5x, MACs 0.3x, latency 0.5x at batch
32 on 1 CPU thread) and fine-tunes it for the same --ft-epochs, with the same optimizer (SGD,
momentum 0.9, weight decay 1e-4), constant LR (--ft-lr), batch size, training subset (--etrs of
the training split, the seed's own) and data order (the framework's (seed, epoch)-seeded
loaders). The validation split (--vs 0.1, of which --evs is used: 1,500 images by default) is
what our search scores candidates on and what every arm's epochs are monitored on; the test
split is only reported.

    python benchmarks/budget_fashion_mnist.py /usr/share/datasets/fashion-mnist \
        --seeds 3 --epochs 6 --ft-epochs 3 --etrs 0.25 --evs 0.25 --out /tmp/budget-bench

Arms (the peers' pruning is in benchmarks/budget_peers.py, the report in budget_bench_report.py):
  uniform    the same filter fraction for every channel group the budget search may shrink
             (compressor.budget.groups), the smallest fraction whose thinned model meets the
             budget (MACs counted, or latency timed, in this process); then a real
             `compress_classifier.py --exp-load-weights-from DENSE --compress YAML` run with a
             schedule in the format budget runs write (L1RankedStructureParameterPruner_AGP per
             group, `group_dependency: Leader`, a FilterRemover), pruning over the same epochs.
  tp         Torch-Pruning's MetaPruner with L1 magnitude importance, `global_pruning=True`,
             the final classifier ignored and at most 90% of a layer's channels pruned (ours
             keeps a quarter of a group), stepped (200 steps to 95% of all channels) until the
             MACs, counted as for every arm, are within the budget (Torch-Pruning's own
             count_ops_and_params ratio, which adds norms and activations, is recorded too); for
             latency the step (i.e. the MACs target) is bisected, every step's model kept, until
             the timed latency is. It is fine-tuned in this
             process with the framework's own train_one_epoch/evaluate, loaders, seeds and
             optimizer factory: a Torch-Pruning model has no thinning recipe, so no compressor
             checkpoint can rebuild it: its weights are saved (weights-only) and its structure
             rebuilt by replaying the same deterministic steps on the dense model.
  ours-nokd  `compress_classifier.py --resume-from DENSE --target-... --no-kd`.
  ours       the same with distillation from the dense model (the budget run's default).

Afterwards every final model is rebuilt from what its run saved and measured side by side: MACs
(forward hooks), CPU latency at batch 32 on 1 thread (all models timed in interleaved rounds,
fair under a shared machine's load) and top-1 on the whole test split. A budget is "met" when
that side-by-side figure is within the target ("own" is the arm's own measurement when it chose
its model). Wall time is search + fine-tune: for ours budget.json's search and fine_tune
seconds (the dense model's test and validation passes for the report are timed apart from the
search); for tp its pruning (and latency bisection) and in-process fine-tune (epochs, their
validation and the test pass); for uniform its fraction search and the CLI run's whole `time`
(results.json, so start-up and data loading too). Wall times and latencies are only
comparable when the machine is not shared: under other jobs' load the smoke run's wall times
took 3-15x longer, and its side-by-side latency ratios moved by up to 0.2 between repeats.

Size: the smoke run (1 seed, --epochs 1 --ft-epochs 1 --etrs 0.05, budget macs-0.5, all arms)
took 6.3 minutes at nice 19 on a quiet 2-core machine (27.5 minutes under other jobs' load).
Its per-image times (dense training 5.4 ms, pruned 2.6-3.3 ms, 5.1 ms distilled; evaluation
1-1.4 ms) and fixed costs (our search ~70 s, Torch-Pruning's pruning ~5 s) put the defaults (3
seeds x (6 dense epochs + 3 budgets x 4 arms x 3 fine-tune epochs) on 15% of the training set,
then 39 test-split evaluations) at about 1.8 hours on 2 idle CPU cores of that machine; on a
2-core AMD EPYC (2026-12-02) they took 32 minutes with 15% of the training set; the defaults
now use a quarter of it (--etrs 0.25, the sizing the targets were set at: every arm's
fine-tune sees more images, and a search's fixed cost weighs less against it), about 1.7x as
long.

Data: `apt-get install -y dataset-fashion-mnist` puts the four IDX .gz files in
/usr/share/datasets/fashion-mnist/. Finished runs are reused when the script is run again with
the same --out (use a new --out after changing settings).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.budget_bench_report import (  # noqa: E402
    ARMS,
    BUDGETS,
    ArmResult,
    budget_table,
    budget_target,
    check_targets,
    mismatches,
    summarize,
    targets_table,
)
from benchmarks.budget_peers import (  # noqa: E402
    LATENCY,
    TorchPruningWalk,
    tp_prune,
    uniform_fraction,
)
from benchmarks.common_measure import count_macs, interleaved_latency, run_cli_logged  # noqa: E402
from compressor.assembly.setup import RunSetup, load_model, resolve_run  # noqa: E402
from compressor.budget.schedule import budget_schedule, schedule_text  # noqa: E402
from compressor.commands.common import load_run_data  # noqa: E402
from compressor.data import DatasetSplits  # noqa: E402
from compressor.training.dataloaders import (  # noqa: E402
    epoch_seed,
    eval_loader,
    seed_everything,
    train_loader,
)
from compressor.training.loop import evaluate, train_one_epoch  # noqa: E402
from compressor.training.losses import get_loss  # noqa: E402
from compressor.utils.config import (  # noqa: E402
    DataConfig,
    ModelRequest,
    OptimizerConfig,
    make_optimizer,
)
from compressor.utils.distributed import DistContext  # noqa: E402

ARCH = "resnet20_cifar"
DATASET = "fashion-mnist"
VALIDATION_SPLIT = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4
LATENCY_ROUNDS = 25  # side-by-side timing: interleaved rounds, each call repeated >= 50 ms
LATENCY_MIN_MS = 50.0
BENCH_JSON = "budget_benchmark.json"


@dataclass(frozen=True)
class Settings:
    """The benchmark's configuration, shared by every seed, budget and arm."""

    data: str
    seeds: tuple[int, ...]
    epochs: int
    ft_epochs: int
    etrs: float
    evs: float
    lr: float
    ft_lr: float
    batch_size: int
    budgets: tuple[str, ...]
    arms: tuple[str, ...]
    out: Path
    arch: str = ARCH


def _common_flags(s: Settings, seed: int) -> list[str]:
    """Data, optimizer and determinism flags every CLI run of one seed shares."""
    return [s.data, "--vs", str(VALIDATION_SPLIT), "--etrs", str(s.etrs), "--evs", str(s.evs),
            "-b", str(s.batch_size), "--momentum", str(MOMENTUM), "--wd", str(WEIGHT_DECAY),
            "-j", "0", "--cpu", "--deterministic", "--seed", str(seed), "-p", "0"]


def _dense_schedule(epochs: int) -> str:
    """The dense run's schedule: the LR drops 10x at 80% of the epochs."""
    decay = max(1, int(epochs * 0.8))
    return (f"version: 1\nlr_schedulers:\n  lr:\n    class: MultiStepLR\n"
            f"    milestones: [{decay}]\n    gamma: 0.1\npolicies:\n  - lr_scheduler:\n"
            f"      instance_name: lr\n    starting_epoch: 0\n    ending_epoch: {decay + 1}\n"
            f"    frequency: 1\n")


def train_dense(s: Settings, seed: int) -> Path:
    """Train (or reuse) the seed's dense model; returns its checkpoint."""
    out = s.out / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "dense" / "results.json").exists():
        schedule = out / "dense.yaml"
        schedule.write_text(_dense_schedule(s.epochs))
        run_cli_logged("-a", s.arch, "--dataset", DATASET, *_common_flags(s, seed), "--epochs",
                       str(s.epochs), "--lr", str(s.lr), "--compress", str(schedule), "-o",
                       str(out), "-n", "dense", log=s.out / "runs.log")
    return out / "dense" / "checkpoint.pth.tar"


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


# -- ours --------------------------------------------------------------------------------------
def run_ours(s: Settings, seed: int, budget: str, dense: Path, kd: bool) -> ArmResult:
    """A budget run from the dense checkpoint (with or without distillation)."""
    quantity, target = budget_target(budget)
    arm = "ours" if kd else "ours-nokd"
    out = s.out / f"seed{seed}"
    run_dir = out / f"{budget}-{arm}"
    if not (run_dir / "budget.json").exists():
        flags = [f"--target-{quantity}", str(target)]
        if quantity == "latency":
            flags += ["--latency-batch", str(LATENCY.batch), "--latency-threads",
                      str(LATENCY.threads)]
        try:
            run_cli_logged(*_common_flags(s, seed), "--resume-from", str(dense), *flags,
                           "--epochs", str(s.ft_epochs), "--lr", str(s.ft_lr),
                           *([] if kd else ["--no-kd"]), "-o", str(out), "-n", run_dir.name,
                           log=s.out / "runs.log")
        except SystemExit:  # exit status 1: a budget missed, still a result to report
            if not (run_dir / "budget.json").exists():
                raise
    report = _read_json(run_dir / "budget.json")
    row = next(r for r in report["budgets"] if r["quantity"] == quantity)
    # best.pth.tar: the model a budget run hands over (best epoch, statistics re-estimated)
    return ArmResult(seed, budget, arm, str(run_dir / "best.pth.tar"), False,
                     float(report["search"]["seconds"]), float(report["fine_tune"]["seconds"]),
                     float(row["achieved"]), bool(row["met"]), float(report["final_test_top1"]),
                     {"search": report["search"], "fine_tune": report["fine_tune"],
                      "accuracy": report["accuracy"], "met": report["met"]})


# -- uniform L1 filters ------------------------------------------------------------------------
def _kd_flags(s: Settings, dense: Path) -> list[str]:
    """The distillation a budget run gives its fine-tune by default: the dense model teaching
    at temperature 1, distillation and student weights 0.5."""
    return ["--kd-teacher", s.arch, "--kd-resume", str(dense), "--kd-temp", "1", "--kd-dw",
            "0.5", "--kd-sw", "0.5"]


def run_uniform(s: Settings, seed: int, budget: str, dense: Path, kd: bool = False
                ) -> ArmResult:
    """Uniform-fraction L1 filter pruning + thinning, fine-tuned by a CLI schedule run (with
    `kd`, distilled from the dense model as our budget runs are)."""
    quantity, target = budget_target(budget)
    out = s.out / f"seed{seed}"
    arm = "uniform-kd" if kd else "uniform"
    run_dir = out / f"{budget}-{arm}"
    record_path = out / f"{budget}-{arm}.json"
    if not record_path.exists():
        started = time.perf_counter()
        groups, removed, found = uniform_fraction(load_model(dense).eval(), quantity, target)
        search_s = time.perf_counter() - started
        schedule = out / f"{budget}-{arm}.yaml"
        schedule.write_text(schedule_text(budget_schedule(groups, removed, s.ft_epochs), [
            f"Uniform L1 filter pruning: {found['fraction']:.4f} of every group's filters "
            f"({budget}), written by benchmarks/budget_fashion_mnist.py."]))
        run_cli_logged("-a", s.arch, "--dataset", DATASET, *_common_flags(s, seed),
                       "--exp-load-weights-from", str(dense), "--compress", str(schedule),
                       "--epochs", str(s.ft_epochs), "--lr", str(s.ft_lr),
                       *(_kd_flags(s, dense) if kd else []), "-o", str(out),
                       "-n", run_dir.name, log=s.out / "runs.log")
        _write_json(record_path, {**found, "removed": list(removed), "search_s": search_s})
    record = _read_json(record_path)
    results = _read_json(run_dir / "results.json")
    return ArmResult(seed, budget, arm, str(run_dir / "checkpoint.pth.tar"), False,
                     float(record["search_s"]), float(results["time"]), float(record["ratio"]),
                     bool(record["met"]), float(results["top1"]), record)


# -- Torch-Pruning global ----------------------------------------------------------------------
def _cpu() -> DistContext:
    return DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def seed_setup(s: Settings, seed: int, dense: Path) -> tuple[RunSetup, DatasetSplits]:
    """The run set-up and the data splits a CLI run from the dense checkpoint builds."""
    setup = resolve_run(ModelRequest(checkpoint=dense), seed=seed, deterministic=True)
    data = load_run_data(setup, DataConfig(root=s.data, validation_split=VALIDATION_SPLIT,
                                           effective_train_size=s.etrs,
                                           effective_valid_size=s.evs), training=True)
    assert isinstance(data, DatasetSplits)
    return setup, data


def fine_tune(model: nn.Module, s: Settings, setup: RunSetup, data: DatasetSplits,
              teacher: Path | None = None) -> dict[str, Any]:
    """The CLI's epoch loop in-process: same seeds, loaders, optimizer, constant LR (with a
    `teacher` checkpoint, the same distillation as a budget run's)."""
    ctx = _cpu()
    optimizer = make_optimizer(model.parameters(), OptimizerConfig(
        lr=s.ft_lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY))
    loss_fn = get_loss(setup.model.arch_spec.loss)
    distillation = None
    if teacher is not None:
        from compressor.distillation import Distillation
        from compressor.utils.config import DistillationConfig

        distillation = Distillation.start(DistillationConfig(
            teacher=ModelRequest(arch=s.arch, checkpoint=teacher)), model, loss_fn, ctx.device)
    monitor = eval_loader(data.val, s.batch_size, 0, ctx)
    history = []
    for epoch in range(s.ft_epochs):
        seed_everything(epoch_seed(setup.seed, epoch, ctx.rank))
        loader = train_loader(data.train, s.batch_size, 0, setup.seed, epoch, ctx)
        trained, epoch_loss = model, loss_fn
        if distillation is not None:
            trained, epoch_loss = distillation.wrap(model), distillation.loss_for_epoch(epoch)
        train = train_one_epoch(trained, loader, epoch_loss, optimizer, ctx.device, epoch)
        val = evaluate(model, monitor, ctx.device, desc="validate")
        history.append({"epoch": epoch, "train_loss": train["loss"], "train_top1": train["top1"],
                        "val_loss": val["loss"], "val_top1": val["top1"]})
    test = evaluate(model, eval_loader(data.test, s.batch_size, 0, ctx), ctx.device)
    return {"history": history, "test_top1": test["top1"]}


def run_tp(s: Settings, seed: int, budget: str, dense: Path, kd: bool = False) -> ArmResult:
    """Torch-Pruning global pruning to the budget, fine-tuned in-process (with `kd`,
    distilled from the dense model as our budget runs are)."""
    quantity, target = budget_target(budget)
    out = s.out / f"seed{seed}"
    arm = "tp-kd" if kd else "tp"
    model_path = out / f"{budget}-{arm}.pt"
    record_path = out / f"{budget}-{arm}.json"
    if not record_path.exists():
        setup, data = seed_setup(s, seed, dense)
        started = time.perf_counter()
        model, found = tp_prune(load_model(dense).eval(), quantity, target)
        search_s = time.perf_counter() - started
        started = time.perf_counter()
        tuned = fine_tune(model, s, setup, data, teacher=dense if kd else None)
        fine_tune_s = time.perf_counter() - started
        # weights only: the structure is rebuilt by replaying the same deterministic steps
        torch.save(model.state_dict(), model_path)
        _write_json(record_path, {**found, **tuned, "search_s": search_s,
                                  "fine_tune_s": fine_tune_s})
    record = _read_json(record_path)
    return ArmResult(seed, budget, arm, str(model_path), True, float(record["search_s"]),
                     float(record["fine_tune_s"]), float(record["ratio"]), bool(record["met"]),
                     float(record["test_top1"]), record)


def run_arm(s: Settings, seed: int, budget: str, arm: str, dense: Path) -> ArmResult:
    """Run (or reuse) one arm of one budget of one seed."""
    print(f"seed {seed}, {budget}: {arm}", flush=True)
    if arm in ("uniform", "uniform-kd"):
        return run_uniform(s, seed, budget, dense, kd=arm.endswith("-kd"))
    if arm in ("tp", "tp-kd"):
        return run_tp(s, seed, budget, dense, kd=arm.endswith("-kd"))
    return run_ours(s, seed, budget, dense, kd=arm == "ours")


# -- side-by-side measurement and report -------------------------------------------------------
def _load_final(result: ArmResult, dense: Path) -> nn.Module:
    if result.pickled:  # Torch-Pruning's steps replayed on the dense model, then its weights
        model = TorchPruningWalk(load_model(dense).eval()).model_at(int(result.detail["step"]))
        model.load_state_dict(torch.load(result.model_path, weights_only=True))
        return model.eval()
    return load_model(result.model_path).eval()


def measure_all(s: Settings, dense: Mapping[int, Path], results: Sequence[ArmResult]
                ) -> dict[str, dict[str, float]]:
    """Key -> MACs, latency (ms per batch) and test top-1 of every final model and dense."""
    models = {f"seed{seed}/dense": load_model(path).eval() for seed, path in dense.items()}
    models.update({f"seed{r.seed}/{r.budget}/{r.arm}": _load_final(r, dense[r.seed])
                   for r in results})
    latency = interleaved_latency(models, LATENCY.batch, LATENCY.threads,
                                  rounds=LATENCY_ROUNDS, min_ms=LATENCY_MIN_MS)
    measured = {key: {"macs": float(count_macs(model)), "latency_ms": latency[key]}
                for key, model in models.items()}
    for seed, path in dense.items():
        _, data = seed_setup(s, seed, path)
        loader = eval_loader(data.test, s.batch_size, 0, _cpu())
        for key, model in models.items():
            if key.startswith(f"seed{seed}/"):
                measured[key]["test_top1"] = evaluate(model, loader, torch.device("cpu"))["top1"]
    return measured


def _command(s: Settings) -> str:
    """The command line that reproduces this benchmark."""
    return shlex.join(["python", "benchmarks/budget_fashion_mnist.py", s.data, "--arch", s.arch,
                       "--seeds",
                       str(len(s.seeds)), "--epochs", str(s.epochs), "--ft-epochs",
                       str(s.ft_epochs), "--etrs", str(s.etrs), "--evs", str(s.evs), "--lr",
                       str(s.lr), "--ft-lr", str(s.ft_lr), "-b", str(s.batch_size), "--budgets",
                       *s.budgets, "--arms", *s.arms, "--out", str(s.out)])


def _settings_line(s: Settings, dense_top1: Mapping[int, float], seconds: float) -> str:
    """What every arm shared, the dense models' test top-1 and the benchmark's wall time."""
    shown = ", ".join(f"seed {seed} {top1:.2f}" for seed, top1 in dense_top1.items())
    return (f"{s.arch}; dense: {s.epochs} epochs, LR {s.lr}; fine-tune: {s.ft_epochs} epochs, LR "
            f"{s.ft_lr} constant; batch {s.batch_size}, train fraction {s.etrs}, validation "
            f"split {VALIDATION_SPLIT} (fraction {s.evs} used); latency: batch {LATENCY.batch}, "
            f"{LATENCY.threads} thread, median of interleaved rounds; dense test top-1: {shown}; "
            f"benchmark wall time {seconds:.0f} s")


def parse_settings() -> Settings:
    """The command line as Settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="Fashion-MNIST directory (the four IDX .gz files)")
    parser.add_argument("--arch", default=ARCH, help="the dense model (default %(default)s)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--epochs", type=int, default=6, help="dense training epochs")
    parser.add_argument("--ft-epochs", type=int, default=3, help="fine-tune epochs, every arm")
    parser.add_argument("--etrs", type=float, default=0.25, help="fraction of training data")
    parser.add_argument("--evs", type=float, default=0.25,
                        help="fraction of the validation split (ours' search scores on it)")
    parser.add_argument("--lr", type=float, default=0.05, help="dense LR (10x lower at 80%%)")
    parser.add_argument("--ft-lr", type=float, default=0.01, help="fine-tune LR (constant)")
    parser.add_argument("-b", "--batch-size", type=int, default=128)
    parser.add_argument("--budgets", nargs="+", default=[b for b, _, _ in BUDGETS],
                        choices=[b for b, _, _ in BUDGETS])
    parser.add_argument("--arms", nargs="+", default=[a for a, _ in ARMS],
                        choices=[a for a, _ in ARMS])
    parser.add_argument("--out", default="logs/budget-bench")
    args = parser.parse_args()
    return Settings(data=args.data, seeds=tuple(range(args.seeds)), epochs=args.epochs,
                    ft_epochs=args.ft_epochs, etrs=args.etrs, evs=args.evs, lr=args.lr,
                    ft_lr=args.ft_lr, batch_size=args.batch_size, budgets=tuple(args.budgets),
                    arms=tuple(a for a, _ in ARMS if a in args.arms), out=Path(args.out),
                    arch=args.arch)


def main() -> None:
    """Train the dense models, run every arm of every budget, measure side by side, report."""
    s = parse_settings()
    s.out.mkdir(parents=True, exist_ok=True)
    command = _command(s)
    print(f"reproduce with:\n  {command}\n", flush=True)
    torch.use_deterministic_algorithms(True, warn_only=True)  # as the CLI's --deterministic
    started = time.perf_counter()
    dense: dict[int, Path] = {}
    results: list[ArmResult] = []
    for seed in s.seeds:
        print(f"seed {seed}: dense", flush=True)
        dense[seed] = train_dense(s, seed)
        for budget in s.budgets:
            for arm in s.arms:
                results.append(run_arm(s, seed, budget, arm, dense[seed]))
    print("measuring every final model side by side", flush=True)
    measured = measure_all(s, dense, results)
    summary = summarize(results, measured)
    tables = [budget_table(budget, summary[budget]) for budget in s.budgets]
    targets = check_targets(summary)
    settings = _settings_line(s, {seed: measured[f"seed{seed}/dense"]["test_top1"]
                                  for seed in s.seeds}, time.perf_counter() - started)
    warnings = mismatches(results, measured)
    report = "\n\n".join(tables + [targets_table(targets), settings] + (
        ["WARNING " + "\nWARNING ".join(warnings)] if warnings else []))
    print("\n" + report, flush=True)
    _write_json(s.out / BENCH_JSON, {
        "command": command, "settings": {**asdict(s), "out": str(s.out)},
        "measured": measured, "runs": [asdict(r) for r in results], "summary": summary,
        "targets": targets, "mismatches": warnings, "report": report})
    (s.out / "table.md").write_text(report + "\n")
    print(f"\nwritten to {s.out / BENCH_JSON}\nreproduce with:\n  {command}")


if __name__ == "__main__":
    main()
