"""KD under torchrun: 2 ranks x batch b take the same step as one process with batch 2b."""

from __future__ import annotations

from pathlib import Path

import torch

from compressor.assembly.state import assemble_checkpoint
from compressor.models import create_model
from compressor.models.description import description_of
from compressor.training.checkpoint import load_checkpoint, save_checkpoint
from tests.conftest import run_cli, run_torchrun
from tests.test_data_idx import write_mnist

# 40 training images: one step of 20 per rank under DDP, one step of 40 in a single process.
# simplenet_mnist has no batch norm, so the per-rank forward is the single process's, split.
TRAIN = ("-a", "simplenet_mnist", "--dataset", "mnist", "--epochs", "1", "--vs", "0", "-j", "0",
         "--cpu", "--deterministic", "-p", "0", "--lr", "0.1", "--momentum", "0.9",
         "--kd-temp", "3", "--kd-dw", "0.8", "--kd-sw", "0.2")


def test_kd_under_ddp_takes_the_single_process_step(tmp_path: Path) -> None:
    data = tmp_path / "mnist"
    write_mnist(data, gz=False, n_train=40, n_test=8)
    torch.manual_seed(7)
    teacher = create_model("resnet20_cifar", "mnist")
    checkpoint = assemble_checkpoint(teacher, args={})
    spec = description_of(teacher).input_spec  # trained at another normalization: re-normalized
    checkpoint["input_spec"] = {**spec.to_dict(), "mean": [0.5], "std": [0.5]}
    save_checkpoint(tmp_path / "teacher.pth.tar", checkpoint)
    kd = ("--kd-resume", str(tmp_path / "teacher.pth.tar"))
    ddp = run_torchrun(2, str(data), *TRAIN, *kd, "-b", "20", "-o", str(tmp_path), "-n", "ddp")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    single = run_cli(str(data), *TRAIN, *kd, "-b", "40", "-o", str(tmp_path), "-n", "single")
    assert single.returncode == 0, single.stderr
    torch.manual_seed(0)  # --deterministic: seed 0 before the student is built
    initial = create_model("simplenet_mnist", "mnist").state_dict()
    states = [load_checkpoint(tmp_path / name / "checkpoint.pth.tar") for name in ("ddp", "single")]
    assert states[0]["distillation"] == states[1]["distillation"]
    for key, value in states[1]["state_dict"].items():
        assert not torch.allclose(value, initial[key], atol=1e-5), key  # the step moved it
        assert torch.allclose(states[0]["state_dict"][key], value, rtol=1e-4, atol=1e-6), key
