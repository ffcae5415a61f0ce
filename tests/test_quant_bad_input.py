"""Bad quantization requests: one stderr line, exit status 2, no traceback, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_user_error, run_cli, run_main

MODEL = ("-a", "simplenet_digits", "-j", "0", "-b", "64", "--cpu")


@pytest.mark.parametrize(("flags", "fragments"), [
    (("-e", "--qe", "--qeba", "17"), ("--qe-bits-acts", "0..16")),
    (("-e", "--qe", "--qebw", "-1"), ("--qe-bits-wts", "0..16")),
    (("-e", "--qe", "--qe-bits-accum", "33"), ("--qe-bits-accum",)),
    (("-e", "--qe", "--qem", "symmetric8"), ("--qe-mode", "invalid choice")),
    (("-e", "--qe", "--qema", "x"), ("--qe-mode-acts",)),
    (("-e", "--qe", "--qeca", "max"), ("--qe-clip-acts", "invalid choice")),
    (("-e", "--qe", "--qe-pytorch-backend", "tensorrt"), ("--qe-pytorch-backend",)),
    (("-e", "--qe", "--qe-calibration", "0"), ("--qe-calibration",)),
    (("-e", "--qe", "--qe-calibration", "nan"), ("--qe-calibration",)),
    (("-e", "--qe", "--qe-clip-n-stds", "-2", "--qeca", "n_std"), ("--qe-clip-n-stds",)),
    (("-e", "--qe", "--qe-stats-file", "s.yaml", "--qe-dynamic"), ("not allowed with",)),
    (("-e", "--qe", "--qe-calibration", "0.1", "--qe-config-file", "c.yaml"),
     ("not allowed with",)),
    (("--qe",), ("needs -e",)),
    (("--qe-calibration", "0.1"), ("needs -e",)),
    (("--qept",), ("needs -e",)),
    (("-e", "--qepc"), ("--qe-per-channel", "add -e --qe")),
    (("-e", "--qe-stats-file", "s.yaml"), ("--qe-stats-file", "add -e --qe")),
    (("-e", "--qe", "--qe-clip-n-stds", "2"), ("needs --qe-clip-acts n_std",)),
    (("-e", "--qe", "--qeca", "n_std"), ("--qe-clip-n-stds",)),
    (("-e", "--qe", "--qept", "--qeba", "4"), ("8-bit", "--qeba 4")),
    (("-e", "--qe", "--qept", "--qe-dynamic"), ("--qe-dynamic",)),
    (("-e", "--qe", "--sense", "element"), ("separate jobs",)),
])
def test_flag_domains_are_refused_at_parse_time(flags: tuple[str, ...],
                                                fragments: tuple[str, ...]) -> None:
    assert_user_error(run_main(*MODEL, *flags), *fragments)


@pytest.mark.parametrize(("flags", "fragments"), [
    (("--qenql", "conv9"), ("conv9", "matches no module")),
    (("--qencl", "nosuchlayer"), ("nosuchlayer",)),
])
def test_layer_names_matching_nothing_are_refused(flags: tuple[str, ...],
                                                  fragments: tuple[str, ...],
                                                  tmp_path: Path) -> None:
    result = run_main(*MODEL, "-e", "--qe", *flags, "-o", str(tmp_path), "-n", "bad")
    assert_user_error(result, *fragments)
    assert not (tmp_path / "bad").exists()


def test_bad_stats_files_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(bytes(range(256)) * 8)
    missing = tmp_path / "missing.yaml"
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    for path in (garbage, missing, listing):
        result = run_main(*MODEL, "-e", "--qe", "--qe-stats-file", str(path), "-o",
                          str(tmp_path), "-n", "bad")
        assert_user_error(result, path.name)
    assert not (tmp_path / "bad").exists()


def test_config_file_must_hold_a_post_training_quantizer(tmp_path: Path) -> None:
    qat = tmp_path / "qat.yaml"
    qat.write_text("quantizers:\n  q:\n    class: DorefaQuantizer\n    bits_weights: 4\n")
    bad_bits = tmp_path / "bits.yaml"
    bad_bits.write_text("quantizers:\n  q:\n    class: PostTrainLinearQuantizer\n"
                        "    bits_activations: 20\n")
    bad_mode = tmp_path / "mode.yaml"
    bad_mode.write_text("quantizers:\n  q:\n    class: PostTrainLinearQuantizer\n"
                        "    mode: SYMETRIC\n")
    for path, fragment in ((qat, "DorefaQuantizer"), (bad_bits, "20"),
                           (bad_mode, "SYMETRIC")):
        result = run_main(*MODEL, "-e", "--qe", "--qe-config-file", str(path), "-o",
                          str(tmp_path), "-n", "bad")
        assert_user_error(result, fragment)
    assert not (tmp_path / "bad").exists()


def test_post_train_quantizer_in_a_training_schedule_is_refused(tmp_path: Path) -> None:
    schedule = tmp_path / "ptq.yaml"
    schedule.write_text("quantizers:\n  q:\n    class: PostTrainLinearQuantizer\n")
    result = run_cli(*MODEL, "--epochs", "1", "--compress", str(schedule), "-o", str(tmp_path),
                     "-n", "bad")
    assert_user_error(result, "PostTrainLinearQuantizer", "--qe-config-file")
